"""The SDK side of the adapter: the trace processor, the response-id hook and the capture checks.

Imported by :meth:`OpenAIAgentsAdapter.make_hooks` only (it imports ``agents``). The processor is
the adapter's :class:`~agentbolt.capture.adapters.AdapterHooks`: one per process, added to the SDK when
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
agent's task or thread), so :class:`~agentbolt.capture.adapters.SpanRecorder` attributes it to the
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

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

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
from agentbolt.capture.adapters import (
    AdapterHooks,
    ToolCallRequests,
    UnitRecord,
    chat_completion_attributes,
    in_rollout,
    never_raises,
    request_attributes,
    text_attribute,
    tool_call,
    tool_calls_of,
    unix_ns,
    usage_attributes,
)

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


class AgentboltTraceProcessor(AdapterHooks, TracingProcessor):
    """Translates SDK traces and spans of rollouts into :class:`UnitRecord` s (see the module docstring).

    Records only while :attr:`active`; never raises (the SDK would log, not raise, anyway).
    """

    def __init__(self, adapter: str) -> None:
        super().__init__(adapter)
        self.tool_calls = ToolCallRequests()
        """By SDK parent span id: function spans lack the call id the LLM output gave (matched by name)."""
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
        hooked = self.wrap(
            OpenAIChatCompletionsModel,
            "_fetch_response",
            before=self._fetch_started,
            after=self._fetch_returned,
            needs=("span", "tracing", "stream"),
        )
        if not hooked:
            self.capture_warning("no_response_id_hook")

    def uninstall(self) -> None:
        """Stop recording: the processor stays added (the SDK cannot remove one processor without
        replacing all of them) but is inert; the base class removes the response-id hook."""
        self.tool_calls.clear()

    def capture_warning(self, reason: str) -> None:
        """Warn that a run records less than training needs (logged once per reason, as an error)."""
        self.warn(reason, RUN_WARNINGS[reason], CaptureWarning, level=logging.ERROR)

    # -- SDK callbacks ----------------------------------------------------------------------------

    @never_raises("on_trace_start", when_active=True)
    def on_trace_start(self, trace: Any) -> None:
        name = getattr(trace, "name", None) or "Agent workflow"
        attrs: dict[str, Any] = {semconv.OPERATION_NAME: "workflow", TRACE_ID: trace.trace_id}
        group = getattr(trace, "group_id", None)
        if group:
            attrs[semconv.GEN_AI_CONVERSATION_ID] = group
        self.recorder.start(("t", trace.trace_id), UnitRecord(semconv.KIND_OPERATION, str(name), attrs))

    @never_raises("on_trace_end", when_active=True)
    def on_trace_end(self, trace: Any) -> None:
        self.recorder.end(("t", trace.trace_id))

    @never_raises("on_span_start", when_active=True)
    def on_span_start(self, span: Any) -> None:
        data = span.span_data
        parent: Key = ("s", span.parent_id) if span.parent_id else ("t", span.trace_id)
        mapping = _mapping_of(data)
        if mapping is None:  # its children attach to its nearest recorded ancestor
            self.recorder.skip(("s", span.span_id), parent)
            return
        record = mapping.start(data)
        record.attributes[SPAN_ID] = span.span_id
        record.start_ns = unix_ns(span.started_at)
        self.recorder.start(("s", span.span_id), record, parent_key=parent)

    @never_raises("on_span_end", when_active=True)
    def on_span_end(self, span: Any) -> None:
        key: Key = ("s", span.span_id)
        data = span.span_data
        self.tool_calls.drop(span.span_id)  # calls requested under it and never run
        mapping = _mapping_of(data)
        if mapping is None or self.recorder.span_id_of(key) is None:  # skipped, or not part of a rollout
            self.recorder.end(key)
            return
        attributes: dict[str, Any] | None = None
        try:
            attributes = mapping.end(self, span, data)
        except Exception as exc:  # one bad field does not lose the span
            self.guard(f"reading {data.type} span data", exc)
        # the SDK names a handoff's target agent after the span started
        name = _handoff_name(data) if isinstance(data, HandoffSpanData) else None
        end_ns = unix_ns(span.ended_at)
        self.recorder.end(key, attributes=attributes, error=_error_text(span.error), end_ns=end_ns, name=name)

    def shutdown(self) -> None:
        """Nothing to flush: spans go to the rollout's sink as they end."""

    def force_flush(self) -> None:
        """Nothing to flush: spans go to the rollout's sink as they end."""

    # -- response ids: the wrapped OpenAIChatCompletionsModel._fetch_response ----------------------------

    def _fetch_started(self, call: Mapping[str, Any]) -> Key | None:
        """The key of the open LLM unit the call completes (``None``: nothing to do), after
        checking the run's tracing settings."""
        if not in_rollout():
            return None
        tracing = call.get("tracing")
        if isinstance(tracing, ModelTracing) and tracing.is_disabled():
            self.capture_warning("run_tracing_disabled")
            return None
        span = call.get("span")
        if span is None or isinstance(span, NoOpSpan) or span.span_id == "no-op":
            self.capture_warning("tracing_disabled")
            return None
        key: Key = ("s", span.span_id)
        if self.recorder.span_id_of(key) is None:
            self.capture_warning("processor_missing")
            return None
        if isinstance(tracing, ModelTracing) and not tracing.include_data():
            self.capture_warning("run_no_sensitive_data")
            self.recorder.update(key, {SENSITIVE_DATA: False})
        return key

    def _fetch_returned(self, call: Mapping[str, Any], key: Key, result: Any) -> Any:
        """The call's result, a ``ChatCompletion`` whose id goes on the unit now, or a stream
        whose first chunk's id will."""
        if not call.get("stream"):
            self._completed(key, result)
        elif isinstance(result, tuple) and len(result) == 2:
            response, chunks = result
            return response, _IdStream(chunks, lambda chunk: self._completed(key, chunk))
        return result

    @never_raises("reading the response id")
    def _completed(self, key: Key, completion: Any) -> None:
        self.recorder.update(key, chat_completion_attributes(completion))


# -- per span type ----------------------------------------------------------------------------------


class _Mapping(NamedTuple):
    """How one SDK span type becomes a unit: ``start(data)`` and ``end(processor, span, data)``."""

    start: Callable[[Any], UnitRecord]
    end: Callable[[AgentboltTraceProcessor, Any, Any], dict[str, Any]]


def _agent_start(data: AgentSpanData) -> UnitRecord:
    return UnitRecord(semconv.KIND_AGENT, f"invoke_agent {data.name}", {semconv.GEN_AI_AGENT_NAME: data.name})


def _agent_end(proc: AgentboltTraceProcessor, span: Any, data: AgentSpanData) -> dict[str, Any]:
    return {
        AGENT_TOOLS: list(data.tools) if data.tools else None,
        AGENT_HANDOFFS: list(data.handoffs) if data.handoffs else None,
        AGENT_OUTPUT_TYPE: data.output_type,
    }


def _generation_start(data: GenerationSpanData) -> UnitRecord:
    attrs = {semconv.GEN_AI_SYSTEM: "openai", semconv.GEN_AI_REQUEST_MODEL: data.model}
    attrs.update(request_attributes(data.model_config))
    return UnitRecord(semconv.KIND_LLM, f"chat {data.model}" if data.model else "chat", attrs)


def _generation_end(proc: AgentboltTraceProcessor, span: Any, data: GenerationSpanData) -> dict[str, Any]:
    attrs = usage_attributes(data.usage)
    if data.output is not None:
        messages = _messages(data.output)
        attrs[semconv.GEN_AI_OUTPUT_MESSAGES] = messages
        proc.tool_calls.add(span.parent_id, tool_calls_of(messages))
    return attrs


def _response_start(data: ResponseSpanData) -> UnitRecord:
    return UnitRecord(semconv.KIND_LLM, "chat", {semconv.GEN_AI_SYSTEM: "openai"})


def _response_end(proc: AgentboltTraceProcessor, span: Any, data: ResponseSpanData) -> dict[str, Any]:
    attrs = usage_attributes(data.usage)
    response = data.response
    if response is not None:
        attrs[semconv.GEN_AI_RESPONSE_ID] = response.id
        attrs[semconv.GEN_AI_REQUEST_MODEL] = str(response.model)
        attrs[semconv.GEN_AI_RESPONSE_MODEL] = str(response.model)
        messages = _response_messages(response.output)
        attrs[semconv.GEN_AI_OUTPUT_MESSAGES] = messages
        proc.tool_calls.add(span.parent_id, tool_calls_of(messages))
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
    call = proc.tool_calls.take(span.parent_id, name=data.name, arguments=data.input)
    return {
        semconv.GEN_AI_TOOL_CALL_ID: call.id if call is not None else None,
        semconv.GEN_AI_TOOL_CALL_ARGUMENTS: text_attribute(data.input, MAX_TEXT),
        semconv.GEN_AI_TOOL_CALL_RESULT: text_attribute(data.output, MAX_TEXT),
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


def _is_added(provider: Any, processor: AgentboltTraceProcessor) -> bool:
    processors = getattr(getattr(provider, "_multi_processor", None), "_processors", None)
    if isinstance(processors, tuple):  # the default provider: look, since set_trace_processors may have dropped it
        return any(p is processor for p in processors)
    return processor.provider is provider
