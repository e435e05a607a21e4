"""What the three adapters share in core besides the lifecycle: ``AdapterHooks.wrap`` (a framework
method wrapped while active, never raising), skipped units in the recorder (children attach to
the nearest recorded ancestor), the pending tool calls, and the OpenAI-shaped field conversions."""

from __future__ import annotations

import asyncio
from typing import Any

from agentbolt import semconv
from agentbolt.capture.adapters import (
    AdapterHooks,
    SpanRecorder,
    ToolCall,
    ToolCallRequests,
    UnitRecord,
    chat_completion_attributes,
    request_attributes,
    text_attribute,
    tool_calls_of,
    usage_attributes,
)
from agentbolt.capture.tracing import RolloutContext, rollout_context


class ListSink:
    def __init__(self) -> None:
        self.spans: list[Any] = []

    def put(self, span: Any) -> None:
        self.spans.append(span)


class Model:
    def call(self, prompt: str, *, stream: bool = False) -> str:
        return f"answer to {prompt}"

    async def acall(self, prompt: str) -> str:
        return f"async answer to {prompt}"


class Hooks(AdapterHooks):
    def install(self) -> None:
        pass

    def uninstall(self) -> None:
        pass


def test_wrap_sees_arguments_by_name_changes_the_result_and_is_undone() -> None:
    original = Model.__dict__["call"]
    hooks = Hooks("toy")
    seen: list[Any] = []
    assert hooks.wrap(Model, "call", before=lambda call: seen.append(dict(call)) or "state", after=_upper)
    assert Model().call("q") == "answer to q"  # inactive: passes through
    hooks.active = True
    assert Model().call("q", stream=True) == "ANSWER TO Q"
    assert seen[0]["prompt"] == "q" and seen[0]["stream"] is True
    hooks.release(object())  # type: ignore[arg-type] # the last one out: the method is put back
    assert Model.__dict__["call"] is original


def test_wrap_never_raises_into_the_framework_and_skips_after_when_before_says_none() -> None:
    hooks = Hooks("toy")
    hooks.active = True

    def broken(call: Any) -> Any:
        raise RuntimeError("injected")

    assert hooks.wrap(Model, "acall", before=broken, after=_upper)
    try:
        assert asyncio.run(Model().acall("q")) == "async answer to q"
        assert hooks.errors == 1
    finally:
        hooks._unpatch()
    assert hooks.wrap(Model, "call", before=lambda call: None, after=_upper)
    try:
        assert Model().call("q") == "answer to q"
    finally:
        hooks._unpatch()


def test_wrap_refuses_a_method_without_the_parameters_it_needs() -> None:
    hooks = Hooks("toy")
    assert not hooks.wrap(Model, "call", after=_upper, needs=("prompt", "tracing"))
    assert not hooks.wrap(Model, "missing", after=_upper)
    assert "__agentbolt_hooks__" not in vars(Model.__dict__["call"])


def test_children_of_a_skipped_unit_attach_to_its_nearest_recorded_ancestor() -> None:
    recorder = SpanRecorder("toy")
    sink = ListSink()
    with rollout_context(RolloutContext("r1", "a1", sink)):
        recorder.start("graph", UnitRecord(semconv.KIND_AGENT, "invoke_agent graph"))
        recorder.skip("sequence", "graph")
        recorder.skip("lambda", "sequence")
        assert recorder.resolve("lambda") == "graph" and recorder.resolve("unknown") is None
        recorder.start("llm", UnitRecord(semconv.KIND_LLM, "chat m"), parent_key="lambda")
        recorder.end("llm")
        assert recorder.end("lambda") is None and recorder.end("sequence") is None  # forgotten, no span
        recorder.end("graph")
    assert recorder.idle()
    llm, graph = sink.spans
    assert llm.parent_span_id == graph.span_id and llm.trace_id == graph.trace_id


def test_pending_tool_calls_join_by_id_or_by_name_and_arguments() -> None:
    pending = ToolCallRequests(limit=2)
    message = {"role": "assistant", "tool_calls": [_call("c1", "search", '{"q": 1}'), _call("c2", "search", "{}")]}
    pending.add("agent", tool_calls_of([message]))
    assert pending.take("agent", name="search", arguments="{}") == ToolCall("c2", "search", "{}")
    assert pending.take("agent", name="search", arguments="other") == ToolCall("c1", "search", '{"q": 1}')
    assert pending.take("agent", name="search") is None
    pending.add("x", [ToolCall("c3", None, "a")])
    pending.add("y", [ToolCall("c4", None, "b")])
    pending.add("z", [ToolCall("c5", None, "c")])  # over the limit: the oldest scope is forgotten
    assert pending.take("x", call_id="c3") is None
    assert pending.take("z", call_id="c5") == ToolCall("c5", None, "c")


def test_openai_shaped_fields_in_either_spelling() -> None:
    assert usage_attributes({"prompt_tokens": 0, "completion_tokens": 7}) == {
        semconv.GEN_AI_USAGE_INPUT_TOKENS: 0,
        semconv.GEN_AI_USAGE_OUTPUT_TOKENS: 7,
    }
    assert usage_attributes(None) == {}
    completion = {
        "id": "chatcmpl-1",
        "model": "m",
        "choices": [{"finish_reason": "stop", "message": {"role": "assistant", "content": "hi", "tool_calls": []}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1},
    }
    attrs = chat_completion_attributes(completion, content=True)
    assert attrs[semconv.GEN_AI_RESPONSE_ID] == "chatcmpl-1"
    assert attrs[semconv.GEN_AI_RESPONSE_FINISH_REASONS] == ["stop"]
    assert attrs[semconv.GEN_AI_OUTPUT_MESSAGES] == [{"role": "assistant", "content": "hi"}]
    assert semconv.GEN_AI_OUTPUT_MESSAGES not in chat_completion_attributes(completion)
    params = {"temperature": 0.5, "max_completion_tokens": 9, "top_p": True}
    assert request_attributes(params) == {
        semconv.GEN_AI_REQUEST_TEMPERATURE: 0.5,
        semconv.GEN_AI_REQUEST_TOP_P: None,
        semconv.GEN_AI_REQUEST_MAX_TOKENS: 9,
    }
    assert text_attribute("abcdef", 3) == "abc…" and text_attribute({"a": 1}, 100) == '{"a": 1}'
    assert text_attribute(None, 3) is None


def _upper(call: Any, state: Any, result: str) -> str:
    return result.upper()


def _call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
