"""What the adapter records beyond the conformance suite: handoffs, failing tools, response ids
(also streamed), the refusal when capture is off, and the user's processors left alone."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from agents import Agent, OpenAIChatCompletionsModel, RunConfig, Runner, set_tracing_disabled
from agents.tracing import TracingProcessor, add_trace_processor
from openai import AsyncOpenAI
from openai_agents_rag import (
    POPULATION_TASK,
    TASKS,
    build_agents,
    make_backend,
    rag_agent,
    run_rag,
    tool_calls_of,
)

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.capture.tracing import RolloutContext, rollout_context
from agentbolt.lightningrl import LightningRL
from agentbolt.testing.adapter_conformance import AdapterConformance, AdapterRun
from agentbolt.testing.fake_llm import FakeLLMServer, FakeTokenizer
from agentbolt_openai_agents import CaptureOffError, CaptureWarning, OpenAIAgentsAdapter
from agentbolt_openai_agents._processor import SENSITIVE_DATA

KIND = semconv.SPAN_KIND_ATTR


def kind_of(span: t.Span) -> Any:
    return span.attributes.get(KIND)


class _Rag(AdapterConformance):
    def make_agent(self):
        return rag_agent

    def make_backend(self):
        return make_backend()


@pytest.fixture(scope="module")
def dev_run() -> AdapterRun:
    """One Trainer.dev run through the gateway: two plain questions and one with a failing tool."""
    adapter = OpenAIAgentsAdapter()
    adapter.instrument()
    errors = adapter.recorder.errors
    try:
        run = _Rag().run_dev(tasks=[*TASKS[:2], POPULATION_TASK])
    finally:
        adapter.uninstrument()
    assert adapter.recorder.errors == errors, "the adapter hit errors on a normal run"
    return run


def rollout_of(run: AdapterRun, question: str) -> t.Rollout:
    return next(r for r in run.rollouts if r.input["question"] == question)


def test_handoff_is_recorded_between_the_two_agents(dev_run: AdapterRun) -> None:
    for rollout in dev_run.rollouts:
        own = dev_run.adapter_spans(rollout.rollout_id)
        by_id = {s.span_id: s for s in own}
        agents = {s.attributes[semconv.GEN_AI_AGENT_NAME]: s for s in own if kind_of(s) == semconv.KIND_AGENT}
        assert set(agents) == {"retriever", "answerer"}
        (handoff,) = [s for s in own if s.attributes.get(semconv.OPERATION_NAME) == "handoff"]
        assert handoff.name == "handoff retriever -> answerer"
        assert handoff.attributes[semconv.HANDOFF_FROM_AGENT] == "retriever"
        assert handoff.attributes[semconv.HANDOFF_TO_AGENT] == "answerer"
        assert handoff.parent_span_id == agents["retriever"].span_id  # made by the retriever's turn
        (root,) = [s for s in own if s.parent_span_id not in by_id]
        assert root.name == "Agent workflow"
        assert agents["retriever"].parent_span_id == agents["answerer"].parent_span_id == root.span_id
        assert agents["retriever"].end_time_ns <= agents["answerer"].start_time_ns  # SDK timestamps


def test_transitions_carry_exact_ids_and_the_agent_of_each_call(dev_run: AdapterRun) -> None:
    tok = FakeTokenizer()
    for task in TASKS[:2]:
        rollout = rollout_of(dev_run, task["question"])
        transitions = sorted(
            (tr for tr in dev_run.transitions if tr.rollout_id == rollout.rollout_id), key=lambda tr: tr.index
        )
        assert [tr.agent_name for tr in transitions] == ["retriever", "retriever", "answerer"]
        gateway = {s.span_id: s for s in dev_run.gateway_spans(rollout.rollout_id)}
        for tr in transitions:  # each transition holds the ids its gateway span recorded
            assert tr.token_source is t.TokenSource.EXACT
            assert tr.response_ids == gateway[tr.span_id].attributes[semconv.RESPONSE_TOKEN_IDS]
            assert tr.prompt_ids == gateway[tr.span_id].attributes[semconv.PROMPT_TOKEN_IDS]
        answer = f"The answer is {task['answer']}."
        assert transitions[-1].response_ids == tok.encode(answer)  # the ids of the text the backend generated
        assert rollout.final_reward == 1.0
        # each adapter LLM span joins the gateway span of the same call, inside the right agent
        own = {s.span_id: s for s in dev_run.adapter_spans(rollout.rollout_id)}
        by_response = {s.attributes[semconv.GEN_AI_RESPONSE_ID]: s for s in gateway.values()}
        for tr in transitions:
            (llm,) = [
                s
                for s in own.values()
                if kind_of(s) == semconv.KIND_LLM
                and s.attributes[semconv.GEN_AI_RESPONSE_ID]
                == gateway[tr.span_id].attributes[semconv.GEN_AI_RESPONSE_ID]
            ]
            assert by_response[llm.attributes[semconv.GEN_AI_RESPONSE_ID]].span_id == tr.span_id
            assert own[llm.parent_span_id].attributes[semconv.GEN_AI_AGENT_NAME] == tr.agent_name
            assert llm.attributes[semconv.GEN_AI_REQUEST_MODEL] == "fake-model"


def test_a_failing_tool_is_an_error_span_and_the_run_goes_on(dev_run: AdapterRun) -> None:
    rollout = rollout_of(dev_run, POPULATION_TASK["question"])
    assert rollout.status is t.RolloutStatus.SUCCEEDED and rollout.final_reward == 1.0  # answered anyway
    tools = [s for s in dev_run.adapter_spans(rollout.rollout_id) if kind_of(s) == semconv.KIND_TOOL]
    failed = [s for s in tools if s.status.code is t.StatusCode.ERROR]
    ok = [s for s in tools if s.status.code is not t.StatusCode.ERROR]
    assert [s.attributes[semconv.GEN_AI_TOOL_NAME] for s in failed] == ["lookup_population"]
    assert [s.attributes[semconv.GEN_AI_TOOL_NAME] for s in ok] == ["search_corpus"]
    (bad,) = failed
    assert bad.name == "execute_tool lookup_population"
    assert bad.status.message.startswith("Error running tool")
    assert bad.attributes[semconv.ERROR_TYPE]
    assert bad.attributes[semconv.GEN_AI_TOOL_CALL_ARGUMENTS] == '{"country":"Peru"}'
    assert ok[0].attributes[semconv.GEN_AI_TOOL_CALL_RESULT] == "Lima is the capital of Peru."
    # the tool call id comes from the LLM output that requested it (the gateway's first response)
    first = min(dev_run.gateway_spans(rollout.rollout_id), key=lambda s: s.seq or 0)
    (call,) = tool_calls_of(first.attributes[semconv.LLM_RESPONSE])
    assert call["function"]["name"] == "lookup_population"
    assert bad.attributes[semconv.GEN_AI_TOOL_CALL_ID] == call["id"]
    # so AIR penalises exactly the call that asked for the failing tool
    batch = LightningRL(credit="air", credit_options={"tool_fallback": "none"}, allow_empty=True).process(
        [rollout], {rollout.rollout_id: dev_run.spans[rollout.rollout_id]}
    )
    rewards = [tr.reward for tr in sorted(batch.transitions, key=lambda tr: tr.index)]
    assert rewards == [0.0, 1.0, 1.0, 1.0]
    assert batch.report.credit.get("air.tool_error.tool_call_id") == 1


# -- in process, against the fake backend directly ----------------------------------------------


class ListSink:
    def __init__(self) -> None:
        self.spans: list[t.Span] = []

    def put(self, span: t.Span) -> None:
        self.spans.append(span)


@pytest.fixture(scope="module")
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(make_backend()) as srv:
        yield srv


@pytest.fixture
def adapter() -> Iterator[OpenAIAgentsAdapter]:
    adapter = OpenAIAgentsAdapter()
    adapter.instrument()
    try:
        yield adapter
    finally:
        adapter.uninstrument()


def in_rollout(coro_fn: Any, rollout_id: str = "r1") -> tuple[Any, list[t.Span]]:
    sink = ListSink()

    async def main() -> Any:
        with rollout_context(RolloutContext(rollout_id, "a1", sink)):  # type: ignore[arg-type]
            return await coro_fn()

    return asyncio.run(main()), sink.spans


def sdk_response_ids(result: Any) -> list[str]:
    """The Chat Completions ids as the SDK itself keeps them (on the run's output items)."""
    return [next(item.provider_data["response_id"] for item in response.output) for response in result.raw_responses]


def llm_ids(spans: list[t.Span]) -> list[str]:
    llm = sorted((s for s in spans if kind_of(s) == semconv.KIND_LLM), key=lambda s: s.start_time_ns)
    return [s.attributes.get(semconv.GEN_AI_RESPONSE_ID) for s in llm]


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
def test_response_ids_are_the_chat_completion_ids(
    adapter: OpenAIAgentsAdapter, server: FakeLLMServer, streamed: bool
) -> None:
    async def run() -> Any:
        async with AsyncOpenAI(base_url=server.base_url, api_key="x") as client:
            agent = build_agents(OpenAIChatCompletionsModel(model="fake-model", openai_client=client))
            if not streamed:
                return await Runner.run(agent, TASKS[0]["question"])
            result = Runner.run_streamed(agent, TASKS[0]["question"])
            async for _ in result.stream_events():
                pass
            return result

    errors = adapter.recorder.errors
    result, spans = in_rollout(run)
    assert result.final_output == "The answer is Paris."
    ids = sdk_response_ids(result)
    assert len(ids) == 3 and all(i.startswith("chatcmpl-") for i in ids)
    assert llm_ids(spans) == ids
    assert all(s.rollout_id == "r1" and s.attempt_id == "a1" for s in spans)
    assert adapter.recorder.errors == errors


def test_nothing_is_recorded_outside_rollouts(adapter: OpenAIAgentsAdapter, server: FakeLLMServer) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", CaptureWarning)
        result = asyncio.run(run_rag(server.base_url, "fake-model", TASKS[1]["question"]))
    assert result.final_output == "The answer is Tokyo."


def test_concurrent_rollouts_in_one_process_keep_their_own_spans(
    adapter: OpenAIAgentsAdapter, server: FakeLLMServer
) -> None:
    sinks = {f"r{i}": ListSink() for i in range(4)}

    async def one(rid: str, question: str) -> Any:
        with rollout_context(RolloutContext(rid, "a1", sinks[rid])):  # type: ignore[arg-type]
            return await run_rag(server.base_url, "fake-model", question)

    async def main() -> list[Any]:
        return await asyncio.gather(*(one(rid, TASKS[i]["question"]) for i, rid in enumerate(sinks)))

    results = asyncio.run(main())
    for (rid, sink), result in zip(sinks.items(), results, strict=True):
        assert {s.rollout_id for s in sink.spans} == {rid}
        assert llm_ids(sink.spans) == sdk_response_ids(result)
        assert len({s.trace_id for s in sink.spans}) == 1


# -- tracing settings ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "value", "match"),
    [
        ("OPENAI_AGENTS_TRACE_INCLUDE_SENSITIVE_DATA", "false", "OPENAI_AGENTS_TRACE_INCLUDE_SENSITIVE_DATA=false"),
        ("OPENAI_AGENTS_DISABLE_TRACING", "1", "OPENAI_AGENTS_DISABLE_TRACING=1"),
    ],
)
def test_instrument_refuses_when_the_environment_turns_capture_off(
    monkeypatch: pytest.MonkeyPatch, env: str, value: str, match: str
) -> None:
    monkeypatch.setenv(env, value)
    adapter = OpenAIAgentsAdapter()
    with pytest.raises(CaptureOffError, match=match) as info:
        adapter.instrument()
    assert "set_trace_processors([])" in str(info.value)  # says how to keep traces local instead
    assert not adapter.instrumented


def test_instrument_refuses_when_tracing_is_disabled() -> None:
    adapter = OpenAIAgentsAdapter()
    set_tracing_disabled(True)
    try:
        with pytest.raises(CaptureOffError, match=r"set_tracing_disabled\(False\)"):
            adapter.instrument()
    finally:
        set_tracing_disabled(False)
    assert not adapter.instrumented


def test_a_run_without_sensitive_data_is_warned_about_and_marked(
    adapter: OpenAIAgentsAdapter, server: FakeLLMServer
) -> None:
    config = RunConfig(trace_include_sensitive_data=False)
    with pytest.warns(CaptureWarning, match=r"RunConfig\(trace_include_sensitive_data=False\)"):
        result, spans = in_rollout(lambda: run_rag(server.base_url, "fake-model", TASKS[2]["question"], config))
    assert result.final_output == "The answer is Rome."
    llm = [s for s in spans if kind_of(s) == semconv.KIND_LLM]
    assert len(llm) == 3 and all(s.attributes[SENSITIVE_DATA] is False for s in llm)
    assert llm_ids(spans) == sdk_response_ids(result)  # the join still works: structure is kept
    tools = [s for s in spans if kind_of(s) == semconv.KIND_TOOL]
    assert tools and all(semconv.GEN_AI_TOOL_CALL_ARGUMENTS not in s.attributes for s in tools)  # what the SDK left out


def test_a_run_with_tracing_disabled_is_warned_about(adapter: OpenAIAgentsAdapter, server: FakeLLMServer) -> None:
    config = RunConfig(tracing_disabled=True)
    with pytest.warns(CaptureWarning, match=r"RunConfig\(tracing_disabled=True\)"):
        result, spans = in_rollout(lambda: run_rag(server.base_url, "fake-model", TASKS[3]["question"], config))
    assert result.final_output == "The answer is Nairobi."
    assert spans == []


# -- the user's processors ------------------------------------------------------------------------


class Collecting(TracingProcessor):
    def __init__(self) -> None:
        self.types: list[str] = []

    def on_trace_start(self, trace: Any) -> None:
        self.types.append("trace")

    def on_trace_end(self, trace: Any) -> None:
        pass

    def on_span_start(self, span: Any) -> None:
        pass

    def on_span_end(self, span: Any) -> None:
        self.types.append(span.span_data.type)

    def shutdown(self) -> None:
        pass

    def force_flush(self) -> None:
        pass


def test_the_users_processors_keep_receiving_everything(server: FakeLLMServer) -> None:
    mine = Collecting()
    add_trace_processor(mine)
    adapter = OpenAIAgentsAdapter()
    adapter.instrument()
    try:
        _, spans = in_rollout(lambda: run_rag(server.base_url, "fake-model", TASKS[4]["question"]))
    finally:
        adapter.uninstrument()
    assert spans, "the adapter recorded nothing"
    assert mine.types.count("trace") == 1
    assert {"agent", "generation", "function", "handoff"} <= set(mine.types)
    asyncio.run(run_rag(server.base_url, "fake-model", TASKS[5]["question"]))
    assert mine.types.count("trace") == 2  # still registered after uninstrument


def test_a_failing_hook_never_reaches_the_agent(
    adapter: OpenAIAgentsAdapter, server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("injected")

    monkeypatch.setattr("agentbolt_openai_agents._processor._messages", broken)  # reading generation outputs
    monkeypatch.setattr("agentbolt_openai_agents._processor.chat_completion_attributes", broken)  # response ids
    errors = adapter.recorder.errors
    result, spans = in_rollout(lambda: run_rag(server.base_url, "fake-model", TASKS[0]["question"]))
    assert result.final_output == "The answer is Paris."
    assert adapter.recorder.errors > errors
    llm = [s for s in spans if kind_of(s) == semconv.KIND_LLM]
    assert len(llm) == 3  # one bad field does not lose the span
    assert all(semconv.GEN_AI_OUTPUT_MESSAGES not in s.attributes for s in llm)
    assert all(semconv.GEN_AI_RESPONSE_ID not in s.attributes for s in llm)


def test_an_agent_without_tools_still_gets_its_name(adapter: OpenAIAgentsAdapter, server: FakeLLMServer) -> None:
    async def run() -> Any:
        async with AsyncOpenAI(base_url=server.base_url, api_key="x") as client:
            solo = Agent(name="solo", model=OpenAIChatCompletionsModel(model="fake-model", openai_client=client))
            return await Runner.run(solo, "hello")

    _, spans = in_rollout(run)
    by_id = {s.span_id: s for s in spans}
    (llm,) = [s for s in spans if kind_of(s) == semconv.KIND_LLM]
    assert by_id[llm.parent_span_id].attributes[semconv.GEN_AI_AGENT_NAME] == "solo"
    assert (
        llm.attributes[semconv.GEN_AI_OUTPUT_MESSAGES]
        == '[{"content": "I cannot help with that.", "role": "assistant"}]'
    )


def test_a_sync_agent_in_a_runner_thread_is_attributed_to_its_rollout(
    adapter: OpenAIAgentsAdapter, server: FakeLLMServer
) -> None:
    def sync_agent() -> Any:  # what runners do with sync agents: a thread running a copy of the context
        client = AsyncOpenAI(base_url=server.base_url, api_key="x")
        agent = build_agents(OpenAIChatCompletionsModel(model="fake-model", openai_client=client))
        return Runner.run_sync(agent, TASKS[1]["question"])

    sink = ListSink()
    with rollout_context(RolloutContext("r-sync", "a1", sink)):  # type: ignore[arg-type]
        context = contextvars.copy_context()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        result = pool.submit(context.run, sync_agent).result()
    assert result.final_output == "The answer is Tokyo."
    assert {s.rollout_id for s in sink.spans} == {"r-sync"}
    assert llm_ids(sink.spans) == sdk_response_ids(result)


def test_responses_api_spans_carry_the_response_id() -> None:
    """Responses API models (not served by the gateway, which speaks Chat Completions) record a
    response span; the adapter reads the id from it, with or without sensitive data."""
    from agents.tracing import agent_span, function_span, response_span, trace
    from openai.types.responses import Response, ResponseFunctionToolCall

    call = ResponseFunctionToolCall(type="function_call", call_id="call_1", name="search", arguments='{"q":"x"}')
    sink = ListSink()
    adapter = OpenAIAgentsAdapter()
    adapter.instrument()
    try:
        with rollout_context(RolloutContext("r-resp", "a1", sink)), trace("manual"), agent_span(name="responder"):  # type: ignore[arg-type]
            with response_span() as with_data:
                with_data.span_data.response = Response.model_construct(id="resp_1", model="gpt-x", output=[call])
            with function_span(name="search", input='{"q":"x"}') as tool:
                tool.span_data.output = "found"
            with response_span() as without_data:
                without_data.span_data._response_id = "resp_2"  # what the SDK keeps when data is excluded
    finally:
        adapter.uninstrument()
    llm = sorted((s for s in sink.spans if kind_of(s) == semconv.KIND_LLM), key=lambda s: s.start_time_ns)
    assert [s.attributes.get(semconv.GEN_AI_RESPONSE_ID) for s in llm] == ["resp_1", "resp_2"]
    assert llm[0].attributes[semconv.GEN_AI_REQUEST_MODEL] == "gpt-x"
    (tool_span,) = [s for s in sink.spans if kind_of(s) == semconv.KIND_TOOL]
    assert tool_span.attributes[semconv.GEN_AI_TOOL_CALL_ID] == "call_1"
    by_id = {s.span_id: s for s in sink.spans}
    assert all(by_id[s.parent_span_id].attributes[semconv.GEN_AI_AGENT_NAME] == "responder" for s in llm)
