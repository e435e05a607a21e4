"""AutoGen's hooks: a logging filter on its event loggers, a span processor and a wrapped
``BaseGroupChat.run_stream``, translating what AutoGen reports into units (imports AutoGen and
OpenTelemetry's SDK only at :meth:`AutogenHooks.install`). What is captured, from which AutoGen
mechanism: see :mod:`agentbolt_autogen.adapter`.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import threading
from collections.abc import AsyncIterator, Callable, Hashable, Mapping
from typing import Any

from agentbolt import semconv
from agentbolt.capture.adapters import (
    AdapterHooks,
    ToolCall,
    ToolCallRequests,
    UnitRecord,
    chat_completion_attributes,
    in_rollout,
    never_raises,
    text_attribute,
    tool_call,
    unix_ns,
    usage_attributes,
)
from agentbolt.capture.tracing import current_rollout

from .errors import AutogenCaptureWarning

__all__ = ["AutogenHooks"]

AUTOGEN_TRACER = "autogen-core"
"""Tracer name of autogen-core's GenAI spans (``trace_invoke_agent_span``, ``trace_tool_span``)."""
MESSAGE_ID = "autogen.message.id"
MESSAGE_TYPE = "autogen.message.type"
MESSAGE_SOURCE = "autogen.message.source"
TOOL_CALL_IDS = "autogen.tool.call_ids"
TEAM_TYPE = "autogen.team.type"
TEAM_PARTICIPANTS = "autogen.team.participants"
TEAM_STOP_REASON = "autogen.team.stop_reason"
TEAM_MESSAGES = "autogen.team.messages"
LLM_STREAM = "autogen.llm.stream"

_OTEL_KINDS = {semconv.OP_INVOKE_AGENT: semconv.KIND_AGENT, semconv.OP_EXECUTE_TOOL: semconv.KIND_TOOL}
_MAX_TEXT = 16 * 1024
_MAX_REMEMBERED = 4096


class AutogenHooks(AdapterHooks):
    """The process-wide hooks into AutoGen (see the module docstring)."""

    def __init__(self, adapter: str) -> None:
        super().__init__(adapter)
        self._handlers: dict[type, Callable[[Any, logging.LogRecord], None]] = {}
        self._filters: list[_EventFilter] = []
        self._chat_types: tuple[type, ...] = ()
        self._skip_types: tuple[type, ...] = ()
        self._task_result: type | None = None
        self._tool_calls = ToolCallRequests(_MAX_REMEMBERED)
        """Requested calls by call id: AutoGen's tool span has the id, not the arguments."""
        self._seen: collections.OrderedDict[tuple[str, str], None] = collections.OrderedDict()
        self._streams: collections.OrderedDict[Hashable, None] = collections.OrderedDict()
        self._ids = itertools.count()

    # -- lifecycle ----------------------------------------------------------------------------

    def install(self) -> None:
        from autogen_agentchat import EVENT_LOGGER_NAME as AGENTCHAT_EVENTS
        from autogen_agentchat.base import TaskResult
        from autogen_agentchat.messages import (
            BaseAgentEvent,
            BaseChatMessage,
            ModelClientStreamingChunkEvent,
            ToolCallExecutionEvent,
            ToolCallRequestEvent,
        )
        from autogen_agentchat.teams import BaseGroupChat
        from autogen_core import EVENT_LOGGER_NAME as CORE_EVENTS
        from autogen_core.logging import LLMCallEvent, LLMStreamEndEvent, LLMStreamStartEvent

        self._handlers = {
            LLMCallEvent: self._on_llm_call,
            LLMStreamStartEvent: self._on_stream_start,
            LLMStreamEndEvent: self._on_stream_end,
            ToolCallRequestEvent: self._on_tool_request,
            ToolCallExecutionEvent: self._on_logged_message,
        }
        self._chat_types = (BaseChatMessage, BaseAgentEvent)
        self._skip_types = (ModelClientStreamingChunkEvent,)
        self._task_result = TaskResult
        self._install_span_processor()
        self._filters = [
            _EventFilter(self, logging.getLogger(CORE_EVENTS), logging.INFO),
            _EventFilter(self, logging.getLogger(AGENTCHAT_EVENTS), logging.DEBUG),
        ]
        self.wrap(BaseGroupChat, "run_stream", after=lambda call, _, stream: self.trace_team(call["self"], stream))

    def uninstall(self) -> None:
        for f in self._filters:
            f.remove()
        self._filters = []
        with self.lock:
            self._tool_calls.clear()
            self._seen.clear()
            self._streams.clear()

    def _install_span_processor(self) -> None:
        from opentelemetry.sdk.trace import TracerProvider

        from agentbolt.capture.tracing import install_otel

        provider = install_otel()  # what runners do; idempotent
        if not isinstance(provider, TracerProvider):
            self.warn(
                "provider",
                "the global OpenTelemetry TracerProvider is not the SDK's: AutoGen's agent and tool spans cannot "
                "be captured (LLM calls, teams and messages still are)",
                AutogenCaptureWarning,
            )
            return
        if getattr(provider, "_agentbolt_autogen_processor", None) is None:
            processor = _make_span_processor(self)
            provider.add_span_processor(processor)
            provider._agentbolt_autogen_processor = processor  # type: ignore[attr-defined]  # our marker: one processor per provider

    # -- AutoGen's OpenTelemetry spans ------------------------------------------------------------

    @never_raises("span", when_active=True)
    def on_span_start(self, span: Any) -> None:
        """Mark AutoGen's agent and tool spans of rollouts as adapter spans."""
        scope = span.instrumentation_scope
        if scope is None or scope.name != AUTOGEN_TRACER:
            return
        attrs = span.attributes
        kind = _OTEL_KINDS.get(attrs.get(semconv.GEN_AI_OPERATION_NAME))
        if kind is None:
            return
        if not in_rollout() and semconv.ROLLOUT_ID not in attrs:
            return  # not part of a rollout
        span.set_attribute(semconv.SPAN_KIND_ATTR, kind)
        span.set_attribute(semconv.ADAPTER, self.adapter)
        if kind == semconv.KIND_TOOL:
            call_id = attrs.get(semconv.GEN_AI_TOOL_CALL_ID)
            call = self._tool_calls.take(call_id, call_id=call_id) if isinstance(call_id, str) and call_id else None
            if call is not None and call.arguments is not None:
                span.set_attribute(semconv.GEN_AI_TOOL_CALL_ARGUMENTS, call.arguments)

    # -- AutoGen's structured events (logging) ----------------------------------------------------

    def handler_for(self, event: Any) -> Callable[[Any, logging.LogRecord], None] | None:
        return self._handlers.get(type(event)) if self.active else None

    def _on_llm_call(self, event: Any, record: logging.LogRecord) -> None:
        if not in_rollout():
            return
        fields = getattr(event, "kwargs", None) or {}
        response = fields.get("response")
        response = response if isinstance(response, Mapping) else {}
        at = unix_ns(record.created)
        attrs = self._llm_attributes(fields)
        attrs.update(chat_completion_attributes(response, content=True))
        model = attrs.get(semconv.GEN_AI_RESPONSE_MODEL)
        key = ("llm", next(self._ids))
        # AutoGen logs the call once it returned and gives no start time: the span marks that
        # moment; the gateway's span of the same response id has the call's timing.
        self.recorder.start(key, UnitRecord(semconv.KIND_LLM, f"chat {model}" if model else "chat", attrs, at))
        self.recorder.end(key, end_ns=at)

    def _on_stream_start(self, event: Any, record: logging.LogRecord) -> None:
        key = _stream_key()
        if not in_rollout():
            return
        with self.lock:
            abandoned = [key] if key in self._streams else []
            abandoned += _remember(self._streams, key)
        for old in abandoned:  # a stream that was cancelled (or never finished) before its end event
            self.recorder.end(old, error="the stream ended without an LLMStreamEndEvent")
        fields = getattr(event, "kwargs", None) or {}
        attrs = self._llm_attributes(fields)
        attrs[LLM_STREAM] = True
        self.recorder.start(key, UnitRecord(semconv.KIND_LLM, "chat", attrs, unix_ns(record.created)))

    def _on_stream_end(self, event: Any, record: logging.LogRecord) -> None:
        key = _stream_key()
        with self.lock:
            if self._streams.pop(key, False) is False:
                return
        fields = getattr(event, "kwargs", None) or {}
        result = fields.get("response")
        attrs = usage_attributes(fields)
        if isinstance(result, Mapping):
            attrs.update(_create_result_attributes(result))
        self.recorder.end(key, attributes=attrs, end_ns=unix_ns(record.created))
        self.warn(
            "stream",
            "AutoGen's streamed model calls (model_client_stream=True) report no response id, so LightningRL "
            "cannot join them to the gateway's token ids or give them an agent name; train with "
            "model_client_stream=False",
            AutogenCaptureWarning,
        )

    def _llm_attributes(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        attrs: dict[str, Any] = {}
        agent_id = fields.get("agent_id")
        if isinstance(agent_id, str) and agent_id:
            attrs[semconv.GEN_AI_AGENT_ID] = agent_id
        name = _current_agent_name()
        if name:
            attrs[semconv.GEN_AI_AGENT_NAME] = name
        return attrs

    def _on_tool_request(self, event: Any, record: logging.LogRecord) -> None:
        if not in_rollout():
            return
        for call in getattr(event, "content", None) or ():
            call_id, arguments = getattr(call, "id", None), getattr(call, "arguments", None)
            if isinstance(call_id, str) and call_id and isinstance(arguments, str):
                self._tool_calls.add(call_id, [ToolCall(call_id, None, text_attribute(arguments, _MAX_TEXT))])
        self.record_message(event)

    def _on_logged_message(self, event: Any, record: logging.LogRecord) -> None:
        self.record_message(event)

    # -- messages -----------------------------------------------------------------------------

    def record_message(self, message: Any, parent_key: Hashable | None = None) -> None:
        """One AgentChat message or event as a message span (once per AutoGen message id)."""
        ctx = current_rollout()
        if ctx is None or ctx.sink is None:
            return
        message_id = getattr(message, "id", None)
        if isinstance(message_id, str) and message_id:
            seen = (ctx.rollout_id, message_id)
            with self.lock:
                if seen in self._seen:
                    return
                _remember(self._seen, seen)
        kind = type(message).__name__
        source = getattr(message, "source", None)
        attrs: dict[str, Any] = {
            MESSAGE_ID: message_id,
            MESSAGE_TYPE: kind,
            MESSAGE_SOURCE: source if isinstance(source, str) else None,
            semconv.MESSAGE_BODY: _text_of(message),
        }
        call_ids = [str(c_id) for c in _as_list(getattr(message, "content", None)) if (c_id := _call_id(c)) is not None]
        if call_ids:
            attrs[TOOL_CALL_IDS] = call_ids
        at = unix_ns(getattr(message, "created_at", None))
        key = ("message", message_id or next(self._ids), next(self._ids))
        self.recorder.start(key, UnitRecord(semconv.KIND_MESSAGE, f"message {kind}", attrs, at), parent_key=parent_key)
        self.recorder.end(key, end_ns=at or None)

    # -- teams --------------------------------------------------------------------------------

    def trace_team(self, team: Any, stream: Any) -> Any:
        """The team's ``run_stream`` generator, traced when it runs inside a rollout."""
        try:
            if not in_rollout():
                return stream
            team_id = str(getattr(team, "_team_id", "") or id(team))
            name = str(getattr(team, "name", "") or type(team).__name__)
            key = ("team", team_id, next(self._ids))
            participants = [str(getattr(p, "name", p)) for p in getattr(team, "_participants", ())]
            record = UnitRecord(
                semconv.KIND_AGENT,
                f"{semconv.OP_INVOKE_AGENT} {name}",
                {
                    semconv.GEN_AI_AGENT_NAME: name,
                    semconv.GEN_AI_AGENT_ID: team_id,
                    semconv.GEN_AI_AGENT_DESCRIPTION: getattr(team, "description", None),
                    semconv.GEN_AI_SYSTEM: "autogen",
                    TEAM_TYPE: type(team).__name__,
                    TEAM_PARTICIPANTS: participants,
                },
            )
            self.recorder.start(key, record)
            parent = self.recorder.otel_context_of(key)
            if parent is None:
                self.recorder.end(key)
                return stream
            return self._team_stream(key, stream, parent)
        except Exception as exc:
            self.guard("team", exc)
            return stream

    async def _team_stream(self, key: Hashable, stream: Any, parent: Any) -> AsyncIterator[Any]:
        from opentelemetry import context as otel_context

        error: BaseException | None = None
        stop_reason: str | None = None
        count = 0
        try:
            while True:
                # The team's span is current only while AutoGen's generator runs (attached and
                # detached in this same step), so the runtime's tasks started there inherit it.
                token = otel_context.attach(parent)
                try:
                    item = await stream.__anext__()
                except StopAsyncIteration:
                    break
                finally:
                    otel_context.detach(token)
                try:
                    if self._task_result is not None and isinstance(item, self._task_result):
                        stop_reason = getattr(item, "stop_reason", None)
                    elif isinstance(item, self._chat_types) and not isinstance(item, self._skip_types):
                        count += 1
                        self.record_message(item, parent_key=key)
                except Exception as exc:
                    self.guard("team message", exc)
                yield item
        except GeneratorExit:  # the caller stopped reading: not an error of the team
            raise
        except BaseException as exc:
            error = exc
            raise
        finally:
            token = otel_context.attach(parent)
            try:
                await stream.aclose()  # a no-op once AutoGen's generator finished
            finally:
                otel_context.detach(token)
                self.recorder.end(key, attributes={TEAM_STOP_REASON: stop_reason, TEAM_MESSAGES: count}, error=error)


class _EventFilter(logging.Filter):
    """Sees AutoGen's structured events on one of its event loggers.

    AutoGen logs events at INFO/DEBUG, below the default WARNING; the logger's level is lowered
    so they reach this filter, which then lets through only the records the logger's previous
    level (or the user's, if they set one since) would have let through: handlers see what they
    saw before.
    """

    def __init__(self, hooks: AutogenHooks, logger: logging.Logger, level: int) -> None:
        super().__init__("agentbolt-autogen")
        self.hooks = hooks
        self.logger = logger
        self.saved = logger.level
        self.level: int | None = None
        if logger.getEffectiveLevel() > level:
            logger.setLevel(level)
            self.level = level
        logger.addFilter(self)

    def remove(self) -> None:
        self.logger.removeFilter(self)
        if self.level is not None and self.logger.level == self.level:
            self.logger.setLevel(self.saved)

    def filter(self, record: logging.LogRecord) -> bool:
        handler = self.hooks.handler_for(record.msg)
        if handler is not None:
            try:
                handler(record.msg, record)
            except Exception as exc:
                self.hooks.guard("event", exc)
        if self.level is None or self.logger.level != self.level:
            return True  # the level is the user's: it already decided
        threshold = self.saved
        if threshold == logging.NOTSET:
            parent = self.logger.parent
            threshold = parent.getEffectiveLevel() if parent is not None else logging.WARNING
        return record.levelno >= threshold


def _make_span_processor(hooks: AutogenHooks) -> Any:
    from opentelemetry.sdk.trace import SpanProcessor

    class AutogenSpanProcessor(SpanProcessor):
        """Marks AutoGen's agent and tool spans of rollouts (inert once uninstrumented)."""

        def on_start(self, span: Any, parent_context: Any = None) -> None:
            hooks.on_span_start(span)

        def on_end(self, span: Any) -> None:
            pass

        def shutdown(self) -> None:
            pass

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return True

    return AutogenSpanProcessor()


# -- helpers ----------------------------------------------------------------------------------


def _current_agent_name() -> str | None:
    """``gen_ai.agent.name`` of AutoGen's current ``invoke_agent`` span, if any."""
    from opentelemetry import trace

    attrs = getattr(trace.get_current_span(), "attributes", None)
    if not attrs or attrs.get(semconv.GEN_AI_OPERATION_NAME) != semconv.OP_INVOKE_AGENT:
        return None
    name = attrs.get(semconv.GEN_AI_AGENT_NAME)
    return name if isinstance(name, str) and name else None


def _stream_key() -> Hashable:
    """A streamed call's start and end events come from the same task under the same span."""
    from opentelemetry import trace

    try:
        task = id(asyncio.current_task())
    except RuntimeError:
        task = None
    return ("stream", threading.get_ident(), task, trace.get_current_span().get_span_context().span_id)


def _create_result_attributes(result: Mapping[str, Any]) -> dict[str, Any]:
    """GenAI attributes of an AutoGen ``CreateResult`` dump (what streams report)."""
    attrs: dict[str, Any] = {}
    if result.get("finish_reason"):
        attrs[semconv.GEN_AI_RESPONSE_FINISH_REASONS] = [str(result["finish_reason"])]
    content = result.get("content")
    message: dict[str, Any] = {"role": "assistant"}
    if isinstance(content, str):
        message["content"] = content
    elif isinstance(content, list):
        message["tool_calls"] = [
            tool_call(c.get("id"), c.get("name"), c.get("arguments")) for c in content if isinstance(c, Mapping)
        ]
    attrs[semconv.GEN_AI_OUTPUT_MESSAGES] = [message]
    return attrs


def _text_of(message: Any) -> str | None:
    try:
        text = message.to_text()
    except Exception:
        text = getattr(message, "content", None)
    return text_attribute(text, _MAX_TEXT)


def _remember(memory: collections.OrderedDict[Any, Any], key: Any, value: Any = None) -> list[Any]:
    """Add ``key`` to one of the hooks' bounded memories; the oldest keys it forgot to stay
    within ``_MAX_REMEMBERED``."""
    memory[key] = value
    return [memory.popitem(last=False)[0] for _ in range(len(memory) - _MAX_REMEMBERED)]


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _call_id(item: Any) -> str | None:
    """The call id of a ``FunctionCall`` or ``FunctionExecutionResult``."""
    value = getattr(item, "call_id", None) or getattr(item, "id", None)
    return value if isinstance(value, str) and value else None
