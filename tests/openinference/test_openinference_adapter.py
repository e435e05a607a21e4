"""agentbolt-openinference: the adapter conformance suite on real smolagents agents instrumented
with OpenInference's SmolagentsInstrumentor, plus the mapping, a managed agent (agent names,
selective training) and plugin hygiene."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import oi_agents as oa
import pytest

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.lightningrl import LightningRL
from agentbolt.lightningrl import spans as sp
from agentbolt.testing.adapter_conformance import AdapterConformance, AdapterRun
from agentbolt.testing.fake_llm import FakeLLM, FakeTokenizer
from agentbolt_openinference import OpenInferenceAdapter


def kind(span: t.Span) -> Any:
    return span.attributes.get(semconv.SPAN_KIND_ATTR)


class TestOpenInferenceAdapter(AdapterConformance):
    """One smolagents ToolCallingAgent per rollout: calculator call, then final answer."""

    adapter_name = "openinference"
    agent_names = {"solver"}
    llm_calls_per_rollout = 2

    def make_adapter(self) -> OpenInferenceAdapter:
        return OpenInferenceAdapter()

    def make_agent(self) -> Any:
        return oa.calc_agent

    def tasks(self) -> list[dict[str, Any]]:
        return oa.calc_tasks(4)

    def make_backend(self) -> FakeLLM:
        return oa.calc_backend()


class TestOpenInferenceManagedAgentConformance(TestOpenInferenceAdapter):
    """The same contract for a manager that delegates to a managed agent: one tree per rollout."""

    agent_names = {"manager", "solver"}
    llm_calls_per_rollout = 4

    def make_agent(self) -> Any:
        return oa.calc_team

    def tasks(self) -> list[dict[str, Any]]:
        return oa.calc_tasks(3)

    test_registered_as_a_plugin = None  # type: ignore[assignment]
    test_supported_versions_are_checked = None  # type: ignore[assignment]
    test_instrument_and_uninstrument_are_idempotent = None  # type: ignore[assignment]


@pytest.fixture
def adapter() -> Any:
    adapter = OpenInferenceAdapter()
    adapter.instrument()
    try:
        yield adapter
    finally:
        adapter.uninstrument()


def run(agent: Any, tasks: list[dict[str, Any]], backend: FakeLLM) -> AdapterRun:
    class Scenario(AdapterConformance):
        def make_agent(self) -> Any:
            return agent

        def make_backend(self) -> FakeLLM:
            return backend

    return Scenario().run_dev(tasks=tasks, concurrency=2)


def test_spans_map_to_agents_tools_and_llm_calls_joined_exactly(adapter: OpenInferenceAdapter) -> None:
    backend = oa.calc_backend()
    result = run(oa.calc_agent, oa.calc_tasks(1), backend)
    (rollout,) = result.rollouts
    assert rollout.final_reward == 1.0
    spans = result.spans[rollout.rollout_id]
    by_id = {s.span_id: s for s in spans}
    own = result.adapter_spans(rollout.rollout_id)
    assert all(s.attributes[semconv.ADAPTER] == "openinference" for s in own)
    (agent,) = [s for s in own if kind(s) == semconv.KIND_AGENT]
    assert agent.name == "solver.run" and agent.attributes[semconv.GEN_AI_AGENT_NAME] == "solver"
    assert agent.attributes["openinference.span.kind"] == "AGENT"  # the instrumentation's own attributes stay
    tools = sorted((s for s in own if kind(s) == semconv.KIND_TOOL), key=lambda s: s.start_time_ns)
    assert [s.attributes[semconv.GEN_AI_TOOL_NAME] for s in tools] == ["calculator", "final_answer"]
    assert json.loads(tools[0].attributes[semconv.GEN_AI_TOOL_CALL_ARGUMENTS]) == {"expression": "0 + 2"}
    assert tools[0].attributes[semconv.GEN_AI_TOOL_CALL_RESULT] == "2"
    steps = [s for s in own if kind(s) == semconv.KIND_OPERATION]
    assert sorted(s.name for s in steps) == ["Step 1", "Step 2"]
    assert all(agent in sp.ancestors(s, by_id) for s in own if s is not agent)  # nesting kept

    # Every LLM call once, joined to the instrumentation's span, with exact ids.
    llm = [s for s in own if kind(s) == semconv.KIND_LLM]
    gateway = result.gateway_spans(rollout.rollout_id)
    assert len(llm) == len(gateway) == len(result.transitions) == 2
    for g in gateway:
        (parent,) = [s for s in llm if s.span_id == g.parent_span_id]  # traceparent reached the gateway
        assert parent.attributes[semconv.GEN_AI_RESPONSE_ID] == g.attributes[semconv.GEN_AI_RESPONSE_ID]
    assert result.report.extraction.get("joined_by_response_id") == 2
    tok = FakeTokenizer()
    requests = [r.body for r in backend.requests if r.path.endswith("/chat/completions")]
    for tr, body in zip(result.transitions, requests, strict=True):
        assert tr.token_source is t.TokenSource.EXACT and tr.agent_name == "solver"
        assert tr.prompt_ids == tok.render_chat(body["messages"], body.get("tools"))
    first_call = min(llm, key=lambda s: s.start_time_ns)
    (message,) = json.loads(first_call.attributes[semconv.GEN_AI_OUTPUT_MESSAGES])
    assert message["tool_calls"][0]["function"]["name"] == "calculator"
    assert sp.tool_call_ids(None, (first_call,)) == [message["tool_calls"][0]["id"]]


def test_tool_error_is_a_failed_tool_span(adapter: OpenInferenceAdapter) -> None:
    from agentbolt.testing.fake_llm import Rule, ToolCall, ToolCalls

    backend = FakeLLM(
        rules=[
            Rule(match="Error", reply=ToolCalls([ToolCall("final_answer", {"answer": "unknown"})])),
            Rule(reply=ToolCalls([ToolCall("calculator", {"expression": "import os"})])),
        ]
    )
    result = run(oa.calc_agent, [{"question": "What is import os?", "answer": 0}], backend)
    (rollout,) = result.rollouts
    assert rollout.status is t.RolloutStatus.SUCCEEDED  # smolagents hands the error back to the model
    (failed,) = [s for s in result.adapter_spans(rollout.rollout_id) if sp.is_failed_tool_span(s)]
    assert failed.attributes[semconv.GEN_AI_TOOL_NAME] == "calculator"


def test_managed_agent_names_and_selective_training(adapter: OpenInferenceAdapter) -> None:
    result = run(oa.calc_team, oa.calc_tasks(2), oa.calc_backend())
    for rollout in result.rollouts:
        names = [tr.agent_name for tr in result.transitions if tr.rollout_id == rollout.rollout_id]
        assert names == ["manager", "solver", "solver", "manager"]
        spans = result.spans[rollout.rollout_id]
        by_id = {s.span_id: s for s in spans}
        (manager,) = [s for s in spans if s.name == "manager.run"]
        (solver,) = [s for s in spans if s.name == "solver.run"]
        assert manager in sp.ancestors(solver, by_id)  # the managed agent runs inside the manager's step
    batch = LightningRL(credit="final", advantage="grpo", agent_match="^solver$", allow_empty=True).process(
        result.rollouts, result.spans
    )
    assert {tr.agent_name for tr in batch.transitions} == {"solver"} and len(batch.transitions) == 4
    assert batch.report.excluded == {"agent_not_selected": 4}


def test_plugin_module_imports_nothing_heavy() -> None:
    code = (
        "import sys, agentbolt_openinference.plugin, agentbolt_openinference; "
        "print(sorted(m for m in ('openinference.semconv', 'smolagents') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def _map_span(name: str, attributes: dict[str, Any]) -> Any:
    """What agentbolt-openinference's hooks make of one OpenInference span."""
    from agentbolt_openinference._hooks import OpenInferenceHooks

    span = t.Span(trace_id="0" * 31 + "1", span_id="0" * 15 + "1", name=name, start_time_ns=1, attributes=attributes)
    return OpenInferenceHooks("openinference").map_span(span)


@pytest.mark.parametrize(
    ("name", "attributes", "tool"),
    [
        ("calculator.__call__", {}, "calculator"),  # DSPy's Tool.__call__ span: no tool.name
        ("calculator.acall", {}, "calculator"),  # DSPy's Tool.acall
        ("SimpleTool", {"tool.name": "final_answer"}, "final_answer"),  # tool.name wins
        ("lookup", {}, "lookup"),
    ],
)
def test_tool_name_from_tool_name_else_the_span_name(name: str, attributes: dict[str, Any], tool: str) -> None:
    from agentbolt import semconv

    record = _map_span(name, {"openinference.span.kind": "TOOL", **attributes})
    assert record is not None and record.attributes[semconv.GEN_AI_TOOL_NAME] == tool


@pytest.mark.parametrize(
    ("name", "attributes", "agent"),
    [
        ("solver.run", {}, "solver"),  # smolagents
        ("solver.task._execute_core", {"graph.node.id": "solver"}, "solver"),  # CrewAI: the agent's role
        ("agent run", {"agent_name": "solver"}, "solver"),  # pydantic-ai, instrumentation version 2
        ("invoke_agent solver", {"gen_ai.agent.name": "solver"}, "solver"),  # pydantic-ai, version 3
        ("anything", {"agent.name": "solver", "graph.node.id": "node"}, "solver"),  # agent.name wins
    ],
)
def test_agent_name_from_the_framework_where_openinference_gives_none(
    name: str, attributes: dict[str, Any], agent: str
) -> None:
    from agentbolt import semconv

    record = _map_span(name, {"openinference.span.kind": "AGENT", **attributes})
    assert record is not None and record.attributes[semconv.GEN_AI_AGENT_NAME] == agent


@pytest.mark.parametrize(
    ("input_value", "agent"),
    [
        ("AgentSetup(input=[...], current_agent_name='solver')", "solver"),  # the event's repr
        ('{"input": [], "current_agent_name": "solver"}', "solver"),  # the event as JSON
        ("AgentSetup(input=[...])", None),  # no agent named: an operation like any other CHAIN span
    ],
)
def test_llama_index_agent_step_is_the_agent_it_names(input_value: str, agent: str | None) -> None:
    """LlamaIndex 0.14's instrumentor marks no span AGENT: its agent step (a CHAIN span) is."""
    record = _map_span("FunctionAgent.run_agent_step", {"openinference.span.kind": "CHAIN", "input.value": input_value})
    assert record is not None
    if agent is None:
        assert record.kind == semconv.KIND_OPERATION
    else:
        assert record.kind == semconv.KIND_AGENT and record.attributes[semconv.GEN_AI_AGENT_NAME] == agent
    other = _map_span("Workflow.run", {"openinference.span.kind": "CHAIN", "input.value": input_value})
    assert other is not None and other.kind == semconv.KIND_OPERATION  # only the agent step names an agent


def test_llm_input_messages_give_the_gateway_fingerprint() -> None:
    """``llm.input_messages.*`` become the span's input messages, whose fingerprint is the one the
    gateway records for the same request (how a streamed call that outlives its span joins)."""
    from agentbolt.request_fingerprint import fingerprints

    request = [
        {"role": "system", "content": "You solve arithmetic."},
        {"role": "user", "content": "What is 1 + 3?"},
        {"role": "tool", "tool_call_id": "call_1", "content": "4"},
    ]
    attributes: dict[str, Any] = {"openinference.span.kind": "LLM"}
    for i, message in enumerate(request):
        attributes |= {f"llm.input_messages.{i}.message.{k}": v for k, v in message.items()}
    record = _map_span("OpenAI.astream_chat", attributes)
    assert record is not None and record.kind == semconv.KIND_LLM
    assert json.loads(record.attributes[semconv.GEN_AI_INPUT_MESSAGES]) == request
    mapped = {k: v for k, v in record.attributes.items() if v is not None}  # what the recorder writes
    stored = t.Span.create("OpenAI.astream_chat", attributes={**attributes, **mapped})
    assert fingerprints(sp.input_messages(stored)) == fingerprints(request)
    assert fingerprints(sp.input_messages(stored)) != fingerprints(request[:2])
