"""The SDK side of the adapter: the trace processor, the response-id hook and the capture checks.

Imported by :meth:`OpenAIAgentsAdapter.make_hooks` only (it imports ``agents``). The processor is
the adapter's :class:`~agentbolt.adapters.AdapterHooks`: one per process, added to the SDK when
the first adapter instance is instrumented.

**Span mapping.** The SDK reports a trace per run (``Runner.run`` opens one unless the user
opened one with ``agents.trace``) and a tree of spans keyed by its own ``trace_id`` /
``span_id`` / ``parent_id``. The processor turns

- the trace into the root span (kind ``operation``, named after the workflow);
- agent spans into ``kind="agent"`` spans with ``gen_ai.agent.name``;
- generation spans (Chat Completions models) and response spans (Responses API models) into
  ``kind="llm"`` spans with ``gen_ai.request.model`` and ``gen_ai.response.id``;
- function spans into ``kind="tool"`` spans with ``gen_ai.tool.name`` (status ERROR when the
  SDK recorded an error), and ``gen_ai.tool.call.id`` when the LLM output that requested it is known;
- handoff spans into ``kind="operation"`` spans recording the agents handed from and to.

Other SDK spans (the run's task span, turn spans, guardrails, custom spans, MCP listings) are
not recorded; their children attach to the nearest recorded ancestor, so the tree keeps its
shape. Every callback runs synchronously in the code that opened or closed the SDK span (the
agent's task or thread), so :class:`~agentbolt.adapters.SpanRecorder` attributes it to the
rollout current there through ``contextvars``.

**Response ids.** A response span carries the Responses API response id. A generation span of
``OpenAIChatCompletionsModel`` does not: the span data holds the assistant message (or, when
streaming, a Responses-shaped object with the placeholder id ``__fake_id__``), and the
Chat Completions id only reaches the run's items (``provider_data["response_id"]``) after the
span ended. The one place that sees the ``ChatCompletion`` (or the chunk stream) while the
span is open is ``OpenAIChatCompletionsModel._fetch_response(..., span, tracing, stream)``:
the adapter wraps it (restored at uninstrument) to put ``gen_ai.response.id`` on the open
span, and to check the run's tracing settings where they are known.
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agents.models.interface import ModelTracing
from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel
from agents.tracing import (
    AgentSpanData,
    FunctionSpanData,
    GenerationSpanData,
    HandoffSpanData,
    ResponseSpanData,
    TracingProcessor,
    add_trace_processor,
    get_trace_provider,
)
from agents.tracing.spans import NoOpSpan

from agentbolt import semconv
from agentbolt.adapters import AdapterHooks, UnitRecord, in_rollout, never_raises, tool_call, unix_ns

from ._capture import RUN_WARNINGS, SENSITIVE_DATA, check_capture_settings
from .errors import CaptureWarning

Key = tuple[str, str]
"""``("t", trace_id)`` for a trace, ``("s", span_id)`` for a span: the SDK's own ids."""

# Attributes beyond agentbolt.semconv (framework-specific ones in the framework's namespace).
TRACE_ID = "openai_agents.trace_id"
SPAN_ID = "openai_agents.span_id"
AGENT_TOOLS = "openai_agents.agent.tools"
AGENT_HANDOFFS = "openai_agents.agent.handoffs"
AGENT_OUTPUT_TYPE = "openai_agents.agent.output_type"
MCP_DATA = "openai_agents.mcp_data"

MAX_TEXT = 16_384
"""Tool arguments and results are cut to this many characters."""

# -----------------------------------------------------------------------------------------------
# The trace processor
# -----------------------------------------------------------------------------------------------


class AgentboltTraceProcessor(AdapterHooks, TracingProcessor):
    """Translates SDK traces and spans of rollouts into :class:`UnitRecord` s (see the module docstring).

    Records only while :attr:`active`; never raises (the SDK would log, not raise, anyway).
    """

    def __init__(self, adapter: str) -> None:
        super().__init__(adapter)
        self._lock = threading.Lock()
        self._alias: dict[str, Key] = {}
        """Unrecorded SDK span id -> key of its nearest recorded ancestor (or its trace)."""
        self._tool_calls: dict[str, list[tuple[str, str, str]]] = {}
        """SDK parent span id -> tool calls (id, name, arguments) its LLM outputs requested, not yet run."""
        self._handoffs: dict[str, UnitRecord] = {}
        """Open handoff units: the SDK names the target agent after the span started."""
        self.provider: Any = None
        """The SDK trace provider this processor was added to."""

    # -- lifecycle (AdapterHooks) -------------------------------------------------------------------

    def check(self) -> None:
        check_capture_settings()

    def install(self) -> None:
        """Add the processor to the SDK's current trace provider (once) and hook response ids."""
        provider = get_trace_provider()
        if not _is_added(provider, self):
            add_trace_processor(self)
            self.provider = provider
        _patch_chat_completions(self)

    def uninstall(self) -> None:
        """Stop recording: the processor stays added (the SDK cannot remove one processor without
        replacing all of them) but is inert; the base class removes the response-id hook."""
        with self._lock:
            self._alias.clear()
            self._tool_calls.clear()
            self._handoffs.clear()

    def capture_warning(self, reason: str) -> None:
        """Warn that a run records less than training needs (logged once per reason, as an error)."""
        self.warn(reason, RUN_WARNINGS[reason], CaptureWarning, level=logging.ERROR)

    # -- SDK callbacks ----------------------------------------------------------------------------

    @never_raises("on_trace_start")
    def on_trace_start(self, trace: Any) -> None:
        if not self.active:
            return
        name = getattr(trace, "name", None) or "Agent workflow"
        attrs: dict[str, Any] = {semconv.OPERATION_NAME: "workflow", TRACE_ID: trace.trace_id}
        group = getattr(trace, "group_id", None)
        if group:
            attrs[semconv.GEN_AI_CONVERSATION_ID] = group
        self.recorder.start(("t", trace.trace_id), UnitRecord(semconv.KIND_OPERATION, str(name), attrs))

    @never_raises("on_trace_end")
    def on_trace_end(self, trace: Any) -> None:
        if not self.active:
            return
        self.recorder.end(("t", trace.trace_id))

    @never_raises("on_span_start")
    def on_span_start(self, span: Any) -> None:
        if not self.active:
            return
        data = span.span_data
        parent = self._parent_key(span)
        mapping = _mapping_of(data)
        if mapping is None:
            with self._lock:
                self._alias[span.span_id] = parent
            return
        record = mapping.start(data)
        record.attributes[SPAN_ID] = span.span_id
        record.start_ns = unix_ns(span.started_at)
        if isinstance(data, HandoffSpanData):
            with self._lock:
                self._handoffs[span.span_id] = record
        self.recorder.start(("s", span.span_id), record, parent_key=parent)

    @never_raises("on_span_end")
    def on_span_end(self, span: Any) -> None:
        if not self.active:
            return
        span_id = span.span_id
        data = span.span_data
        mapping = _mapping_of(data)
        if mapping is None:
            with self._lock:
                self._alias.pop(span_id, None)
                self._tool_calls.pop(span_id, None)
            return
        key: Key = ("s", span_id)
        with self._lock:
            self._tool_calls.pop(span_id, None)  # calls requested under it and never run
            record = self._handoffs.pop(span_id, None)
        if record is not None:  # the recorder holds this record: name it now both agents are known
            record.name = _handoff_name(data)
        if self.recorder.span_id_of(key) is None:  # not part of a rollout
            return
        attributes: dict[str, Any] | None = None
        try:
            attributes = mapping.end(self, span, data)
        except Exception as exc:  # one bad field does not lose the span
            self.guard(f"reading {data.type} span data", exc)
        self.recorder.end(key, attributes=attributes, error=_error_text(span.error), end_ns=unix_ns(span.ended_at))

    def shutdown(self) -> None:
        """Nothing to flush: spans go to the rollout's sink as they end."""

    def force_flush(self) -> None:
        """Nothing to flush: spans go to the rollout's sink as they end."""

    # -- helpers ------------------------------------------------------------------------------------

    def _parent_key(self, span: Any) -> Key:
        parent_id = span.parent_id
        if not parent_id:
            return ("t", span.trace_id)
        with self._lock:
            return self._alias.get(parent_id) or ("s", parent_id)

    def note_tool_calls(self, parent_id: str | None, messages: Sequence[Mapping[str, Any]]) -> None:
        """Remember the tool calls an LLM output requested (matched to function spans of the same parent)."""
        if not parent_id:
            return
        calls = [
            (str(c.get("id")), str(fn.get("name")), str(fn.get("arguments")))
            for m in messages
            for c in (m.get("tool_calls") or ())
            if isinstance(c, Mapping) and isinstance(fn := c.get("function"), Mapping) and c.get("id")
        ]
        if calls:
            with self._lock:
                self._tool_calls.setdefault(parent_id, []).extend(calls)

    def take_tool_call(self, parent_id: str | None, name: str, arguments: str | None) -> str | None:
        """The id of the pending tool call a function span ran (same name, preferably same arguments)."""
        if not parent_id:
            return None
        with self._lock:
            calls = self._tool_calls.get(parent_id)
            if not calls:
                return None
            for same_args in (True, False):
                for i, (call_id, call_name, call_args) in enumerate(calls):
                    if call_name == name and (not same_args or call_args == arguments):
                        del calls[i]
                        return call_id
        return None


# -- per span type ----------------------------------------------------------------------------------


class _Mapping:
    """How one SDK span type becomes a unit: ``start(data)`` and ``end(processor, span, data)``."""

    def __init__(
        self, start: Callable[[Any], UnitRecord], end: Callable[[AgentboltTraceProcessor, Any, Any], dict[str, Any]]
    ) -> None:
        self.start = start
        self.end = end


def _agent_start(data: AgentSpanData) -> UnitRecord:
    return UnitRecord(semconv.KIND_AGENT, f"invoke_agent {data.name}", {semconv.GEN_AI_AGENT_NAME: data.name})


def _agent_end(proc: AgentboltTraceProcessor, span: Any, data: AgentSpanData) -> dict[str, Any]:
    return {
        AGENT_TOOLS: list(data.tools) if data.tools else None,
        AGENT_HANDOFFS: list(data.handoffs) if data.handoffs else None,
        AGENT_OUTPUT_TYPE: data.output_type,
    }


def _generation_start(data: GenerationSpanData) -> UnitRecord:
    attrs: dict[str, Any] = {semconv.GEN_AI_SYSTEM: "openai", semconv.GEN_AI_REQUEST_MODEL: data.model}
    config = data.model_config
    if isinstance(config, Mapping):
        attrs[semconv.GEN_AI_REQUEST_TEMPERATURE] = config.get("temperature")
        attrs[semconv.GEN_AI_REQUEST_TOP_P] = config.get("top_p")
        attrs[semconv.GEN_AI_REQUEST_MAX_TOKENS] = config.get("max_tokens")
    return UnitRecord(semconv.KIND_LLM, f"chat {data.model}" if data.model else "chat", attrs)


def _generation_end(proc: AgentboltTraceProcessor, span: Any, data: GenerationSpanData) -> dict[str, Any]:
    attrs = _usage(data.usage)
    if data.output is not None:
        messages = _messages(data.output)
        attrs[semconv.GEN_AI_OUTPUT_MESSAGES] = messages
        proc.note_tool_calls(span.parent_id, messages)
    return attrs


def _response_start(data: ResponseSpanData) -> UnitRecord:
    return UnitRecord(semconv.KIND_LLM, "chat", {semconv.GEN_AI_SYSTEM: "openai"})


def _response_end(proc: AgentboltTraceProcessor, span: Any, data: ResponseSpanData) -> dict[str, Any]:
    attrs = _usage(data.usage)
    response = data.response
    if response is not None:
        attrs[semconv.GEN_AI_RESPONSE_ID] = response.id
        attrs[semconv.GEN_AI_REQUEST_MODEL] = str(response.model)
        attrs[semconv.GEN_AI_RESPONSE_MODEL] = str(response.model)
        messages = _response_messages(response.output)
        attrs[semconv.GEN_AI_OUTPUT_MESSAGES] = messages
        proc.note_tool_calls(span.parent_id, messages)
    else:  # sensitive data excluded: the SDK still keeps the id
        attrs[semconv.GEN_AI_RESPONSE_ID] = data.export().get("response_id")
    return attrs


def _function_start(data: FunctionSpanData) -> UnitRecord:
    return UnitRecord(
        semconv.KIND_TOOL,
        f"execute_tool {data.name}",
        {semconv.GEN_AI_TOOL_NAME: data.name, semconv.GEN_AI_TOOL_TYPE: "function"},
    )


def _function_end(proc: AgentboltTraceProcessor, span: Any, data: FunctionSpanData) -> dict[str, Any]:
    return {
        semconv.GEN_AI_TOOL_CALL_ID: proc.take_tool_call(span.parent_id, data.name, data.input),
        semconv.GEN_AI_TOOL_CALL_ARGUMENTS: _cut(data.input),
        semconv.GEN_AI_TOOL_CALL_RESULT: _cut(data.output),
        MCP_DATA: data.mcp_data or None,
    }


def _handoff_start(data: HandoffSpanData) -> UnitRecord:
    return UnitRecord(semconv.KIND_OPERATION, _handoff_name(data), {semconv.OPERATION_NAME: "handoff"})


def _handoff_end(proc: AgentboltTraceProcessor, span: Any, data: HandoffSpanData) -> dict[str, Any]:
    return {semconv.HANDOFF_FROM_AGENT: data.from_agent, semconv.HANDOFF_TO_AGENT: data.to_agent}


def _handoff_name(data: HandoffSpanData) -> str:
    if data.from_agent and data.to_agent:
        return f"handoff {data.from_agent} -> {data.to_agent}"
    return "handoff"


_MAPPINGS: dict[type, _Mapping] = {
    AgentSpanData: _Mapping(_agent_start, _agent_end),
    GenerationSpanData: _Mapping(_generation_start, _generation_end),
    ResponseSpanData: _Mapping(_response_start, _response_end),
    FunctionSpanData: _Mapping(_function_start, _function_end),
    HandoffSpanData: _Mapping(_handoff_start, _handoff_end),
}


def _mapping_of(data: Any) -> _Mapping | None:
    mapping = _MAPPINGS.get(type(data))
    if mapping is None:
        for cls, candidate in _MAPPINGS.items():
            if isinstance(data, cls):
                return candidate
    return mapping


# -- field conversions --------------------------------------------------------------------------------


def _usage(usage: Mapping[str, Any] | None) -> dict[str, Any]:
    if not isinstance(usage, Mapping):
        return {}
    return {
        semconv.GEN_AI_USAGE_INPUT_TOKENS: usage.get("input_tokens"),
        semconv.GEN_AI_USAGE_OUTPUT_TOKENS: usage.get("output_tokens"),
    }


def _cut(value: Any) -> str | None:
    if value is None:
        return None
    text = value if isinstance(value, str) else str(value)
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + "…"


def _error_text(error: Any) -> str | None:
    """``SpanError`` ({message, data}) as one line, e.g. ``Error running tool (non-fatal): ...``."""
    if not error:
        return None
    if isinstance(error, Mapping):
        message = str(error.get("message") or "error")
        data = error.get("data")
        detail = data.get("error") if isinstance(data, Mapping) else None
        return f"{message}: {detail}" if detail else message
    return str(error)


def _messages(output: Sequence[Any]) -> list[dict[str, Any]]:
    """A generation's output as OpenAI chat messages (the Chat Completions model records the
    assistant message; streaming, a Responses-shaped object)."""
    messages: list[dict[str, Any]] = []
    for item in output:
        if not isinstance(item, Mapping):
            continue
        if item.get("object") == "response" or ("output" in item and "role" not in item):
            messages.extend(_response_messages(item.get("output") or ()))
        else:
            messages.append({k: v for k, v in item.items() if v is not None})
    return messages


def _response_messages(items: Sequence[Any]) -> list[dict[str, Any]]:
    """Responses API output items as one assistant chat message (text and tool calls)."""
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for item in items:
        entry = item.model_dump() if hasattr(item, "model_dump") else item
        if not isinstance(entry, Mapping):
            continue
        kind = entry.get("type")
        if kind == "message":
            for part in entry.get("content") or ():
                if isinstance(part, Mapping) and part.get("type") in ("output_text", "text"):
                    texts.append(str(part.get("text") or ""))
                elif isinstance(part, Mapping) and part.get("type") == "refusal":
                    texts.append(str(part.get("refusal") or ""))
        elif kind == "function_call":
            calls.append(tool_call(entry.get("call_id"), entry.get("name"), entry.get("arguments")))
    if not texts and not calls:
        return []
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
    if calls:
        message["tool_calls"] = calls
    return [message]


# -----------------------------------------------------------------------------------------------
# The response-id hook on OpenAIChatCompletionsModel
# -----------------------------------------------------------------------------------------------


class _IdStream:
    """The Chat Completions chunk stream, passed through; the first chunk id is reported."""

    __slots__ = ("_on_id", "_seen", "_stream")

    def __init__(self, stream: Any, on_id: Callable[[Any], None]) -> None:
        self._stream = stream
        self._on_id = on_id
        self._seen = False

    def __aiter__(self) -> _IdStream:
        return self

    async def __anext__(self) -> Any:
        chunk = await self._stream.__anext__()
        if not self._seen:
            chunk_id = getattr(chunk, "id", None)
            if chunk_id:
                self._seen = True
                self._on_id(chunk)
        return chunk

    def __getattr__(self, name: str) -> Any:  # response, close(), ... of the real stream
        return getattr(self._stream, name)


class _ResponseIdHook:
    """What the ``_fetch_response`` wrapper does around the real call (every step guarded)."""

    def __init__(self, hooks: AgentboltTraceProcessor, positions: Mapping[str, int]) -> None:
        self.hooks = hooks
        self.recorder = hooks.recorder
        self.positions = positions

    def _arg(self, args: tuple[Any, ...], kwargs: Mapping[str, Any], name: str, default: Any = None) -> Any:
        if name in kwargs:
            return kwargs[name]
        i = self.positions[name]
        return args[i] if i < len(args) else default

    def before(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[Key | None, bool]:
        """The key of the open LLM unit to complete (``None``: nothing to do) and whether it streams."""
        try:
            if not in_rollout():
                return None, False
            tracing = self._arg(args, kwargs, "tracing")
            if isinstance(tracing, ModelTracing) and tracing.is_disabled():
                self.hooks.capture_warning("run_tracing_disabled")
                return None, False
            span = self._arg(args, kwargs, "span")
            if span is None or isinstance(span, NoOpSpan) or span.span_id == "no-op":
                self.hooks.capture_warning("tracing_disabled")
                return None, False
            key: Key = ("s", span.span_id)
            if self.recorder.span_id_of(key) is None:
                self.hooks.capture_warning("processor_missing")
                return None, False
            if isinstance(tracing, ModelTracing) and not tracing.include_data():
                self.hooks.capture_warning("run_no_sensitive_data")
                self.recorder.update(key, {SENSITIVE_DATA: False})
            return key, bool(self._arg(args, kwargs, "stream", False))
        except Exception as exc:
            self.hooks.guard("reading the LLM call", exc)
            return None, False

    def after(self, key: Key | None, stream: bool, result: Any) -> Any:
        if key is None:
            return result
        try:
            if stream:
                if isinstance(result, tuple) and len(result) == 2:
                    response, chunks = result
                    return response, _IdStream(chunks, functools.partial(self._completed, key))
                return result
            self._completed(key, result)
        except Exception as exc:
            self.hooks.guard("reading the response id", exc)
        return result

    def _completed(self, key: Key, completion: Any) -> None:
        attrs: dict[str, Any] = {
            semconv.GEN_AI_RESPONSE_ID: getattr(completion, "id", None),
            semconv.GEN_AI_RESPONSE_MODEL: getattr(completion, "model", None),
        }
        choices = getattr(completion, "choices", None)
        if choices and getattr(completion, "object", None) == "chat.completion":
            attrs[semconv.GEN_AI_RESPONSE_FINISH_REASONS] = [str(c.finish_reason) for c in choices]
        self.recorder.update(key, attrs)


def _patch_chat_completions(hooks: AgentboltTraceProcessor) -> None:
    original = OpenAIChatCompletionsModel.__dict__.get("_fetch_response")
    try:
        names = list(inspect.signature(original).parameters)[1:]  # without self
        positions = {name: names.index(name) for name in ("span", "tracing", "stream")}
    except (TypeError, ValueError):
        hooks.capture_warning("no_response_id_hook")
        return
    hook = _ResponseIdHook(hooks, positions)

    def wrap(original: Any) -> Any:
        @functools.wraps(original)
        async def _fetch_response(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not hooks.active:
                return await original(self, *args, **kwargs)
            key, stream = hook.before(args, kwargs)
            result = await original(self, *args, **kwargs)
            return hook.after(key, stream, result)

        return _fetch_response

    hooks.patch(OpenAIChatCompletionsModel, "_fetch_response", wrap)


def _is_added(provider: Any, processor: AgentboltTraceProcessor) -> bool:
    processors = getattr(getattr(provider, "_multi_processor", None), "_processors", None)
    if isinstance(processors, tuple):  # the default provider: look, since set_trace_processors may have dropped it
        return any(p is processor for p in processors)
    return processor.provider is provider
