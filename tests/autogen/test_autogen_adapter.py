"""agentbolt-autogen: the adapter conformance suite on a real AutoGen AgentChat agent, plus tool
errors, teams (agent names, selective training), hook hygiene and cheap plugin import."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import autogen_agents as ag
import pytest

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.capture.tracing import RolloutContext, rollout_context
from agentbolt.lightningrl import LightningRL
from agentbolt.lightningrl import spans as sp
from agentbolt.testing.adapter_conformance import AdapterConformance, AdapterRun
from agentbolt.testing.fake_llm import FakeLLM, FakeTokenizer, Rule, ToolCall, ToolCalls
from agentbolt_autogen import AutogenAdapter
from agentbolt_autogen.adapter import AutogenCaptureWarning


def kind(span: t.Span) -> Any:
    return span.attributes.get(semconv.SPAN_KIND_ATTR)


class TestAutogenAdapter(AdapterConformance):
    """One AssistantAgent with a calculator tool, per rollout: tool call, tool, answer."""

    adapter_name = "autogen"
    agent_names = {"solver"}
    llm_calls_per_rollout = 2

    def make_adapter(self) -> AutogenAdapter:
        return AutogenAdapter()

    def make_agent(self) -> Any:
        return ag.calc_agent

    def tasks(self) -> list[dict[str, Any]]:
        return ag.calc_tasks(4)

    def make_backend(self) -> FakeLLM:
        return ag.calc_backend()


class TestAutogenTeamConformance(TestAutogenAdapter):
    """The same contract for a two-agent RoundRobinGroupChat: one tree (the team) per rollout."""

    agent_names = {"solver", "checker"}
    llm_calls_per_rollout = 3

    def make_agent(self) -> Any:
        return ag.calc_team

    def tasks(self) -> list[dict[str, Any]]:
        return ag.calc_tasks(3)

    # Registration, version checks and idempotency do not depend on the agent: run them once.
    test_registered_as_a_plugin = None  # type: ignore[assignment]
    test_supported_versions_are_checked = None  # type: ignore[assignment]
    test_instrument_and_uninstrument_are_idempotent = None  # type: ignore[assignment]


@pytest.fixture
def adapter() -> Iterator[AutogenAdapter]:
    adapter = AutogenAdapter()
    adapter.instrument()
    try:
        yield adapter
    finally:
        adapter.uninstrument()


def run(agent: Any, tasks: list[dict[str, Any]], backend: FakeLLM) -> AdapterRun:
    """Trainer.dev through the gateway, as the conformance suite runs it."""

    class Scenario(AdapterConformance):
        def make_agent(self) -> Any:
            return agent

        def make_backend(self) -> FakeLLM:
            return backend

    return Scenario().run_dev(tasks=tasks, concurrency=2)


def test_tool_error_is_an_error_span_and_the_run_continues(adapter: AutogenAdapter) -> None:
    backend = FakeLLM(
        rules=[
            Rule(match=lambda r: r.messages[-1]["role"] == "tool", reply="The calculator failed."),
            Rule(reply=ToolCalls([ToolCall("calculator", {"expression": "import os"}, id="call_bad_expr")])),
        ]
    )
    result = run(ag.calc_agent, [{"question": "What is import os?", "answer": 0}], backend)
    (rollout,) = result.rollouts
    assert rollout.status is t.RolloutStatus.SUCCEEDED
    spans = result.adapter_spans(rollout.rollout_id)
    (tool,) = [s for s in spans if kind(s) == semconv.KIND_TOOL]
    assert tool.name == "execute_tool calculator"
    assert tool.status.code is t.StatusCode.ERROR
    assert "not an arithmetic expression" in tool.status.message
    assert tool.attributes[semconv.ERROR_TYPE] == "ValueError"
    assert tool.attributes[semconv.GEN_AI_TOOL_NAME] == "calculator"
    assert tool.attributes[semconv.GEN_AI_TOOL_CALL_ID] == "call_bad_expr"
    assert json.loads(tool.attributes["gen_ai.tool.call.arguments"]) == {"expression": "import os"}
    assert any(e.name == "exception" for e in tool.events)
    assert sp.is_failed_tool_span(tool)  # what LightningRL's AIR credit penalises
    # The agent went on: the tool error went back to the model, which answered.
    llm = [s for s in spans if kind(s) == semconv.KIND_LLM]
    assert len(llm) == 2 == len(result.transitions)
    assert sp.tool_call_ids(None, (llm[0],)) == ["call_bad_expr"]  # the call that asked for the tool
    (agent,) = [s for s in spans if kind(s) == semconv.KIND_AGENT]
    assert tool.parent_span_id == agent.span_id and all(s.parent_span_id == agent.span_id for s in llm)
    assert agent.status.code is not t.StatusCode.ERROR
    outcome = [s for s in spans if s.attributes.get("autogen.message.type") == "ToolCallExecutionEvent"]
    assert len(outcome) == 1 and outcome[0].attributes["autogen.tool.call_ids"] == ["call_bad_expr"]
    assert backend.requests[-1].body["messages"][-1]["tool_call_id"] == "call_bad_expr"


def test_team_transitions_carry_each_agents_name_and_agent_match_selects(adapter: AutogenAdapter) -> None:
    backend = ag.calc_backend()
    result = run(ag.calc_team, ag.calc_tasks(1), backend)
    (rollout,) = result.rollouts
    assert rollout.final_reward == 1.0
    spans = result.spans[rollout.rollout_id]

    # Exact token ids, recomputed from what the backend received and answered.
    tok = FakeTokenizer()
    requests = [r.body for r in backend.requests if r.path.endswith("/chat/completions")]
    assert [tr.agent_name for tr in result.transitions] == ["solver", "solver", "checker"]
    assert len(requests) == 3
    for tr, body in zip(result.transitions, requests, strict=True):
        assert tr.token_source is t.TokenSource.EXACT
        assert tr.prompt_ids == tok.render_chat(body["messages"], body.get("tools"))
    assert result.transitions[1].response_ids == tok.encode("The answer is 6.")
    assert result.transitions[2].response_ids == tok.encode("APPROVE")

    # One tree: the team's span encloses both agents' turns, their LLM calls and tool calls.
    own = result.adapter_spans(rollout.rollout_id)
    by_id = {s.span_id: s for s in spans}
    (team,) = [s for s in own if s.attributes.get("autogen.team.type") == "RoundRobinGroupChat"]
    assert team.name == "invoke_agent RoundRobinGroupChat" and team.parent_span_id is None
    assert team.attributes["autogen.team.participants"] == ["solver", "checker"]
    assert team.attributes["autogen.team.stop_reason"].startswith("Text 'APPROVE' mentioned")
    turns = [s for s in own if kind(s) == semconv.KIND_AGENT and s is not team]
    assert sorted(s.attributes[semconv.GEN_AI_AGENT_NAME] for s in turns) == ["checker", "solver"]
    for s in own:
        assert s is team or team in sp.ancestors(s, by_id), s.name
    for s in own:
        if kind(s) == semconv.KIND_LLM:
            (turn,) = [p for p in sp.ancestors(s, by_id) if p in turns]
            assert s.attributes[semconv.GEN_AI_AGENT_NAME] == turn.attributes[semconv.GEN_AI_AGENT_NAME]

    # Messages between the agents, once each, in the team's tree.
    messages = [s for s in own if kind(s) == semconv.KIND_MESSAGE]
    shown = sorted((s.attributes["autogen.message.source"], s.attributes["autogen.message.type"]) for s in messages)
    assert shown == [
        ("checker", "TextMessage"),
        ("solver", "TextMessage"),
        ("solver", "ToolCallExecutionEvent"),
        ("solver", "ToolCallRequestEvent"),
        ("user", "TextMessage"),
    ]
    assert len({s.attributes["autogen.message.id"] for s in messages}) == len(messages)
    reply = [s for s in messages if s.attributes["autogen.message.source"] == "checker"]
    assert reply[0].attributes[semconv.MESSAGE_BODY] == "APPROVE"

    # Multi-agent selective optimisation: train the solver only.
    batch = LightningRL(credit="final", advantage="grpo", agent_match="^solver$", allow_empty=True).process(
        result.rollouts, result.spans
    )
    assert [tr.agent_name for tr in batch.transitions] == ["solver", "solver"]
    assert batch.report.excluded == {"agent_not_selected": 1}
    assert batch.report.per_agent["checker"].trained == 0


async def test_outside_rollouts_agents_run_untouched_and_logging_is_left_as_it_was(fake_server: Any) -> None:
    events = logging.getLogger("autogen_core.events")
    before = (events.level, list(events.filters))
    seen: list[logging.LogRecord] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    root = logging.getLogger()
    handler = Collect()
    root.addHandler(handler)
    adapter = AutogenAdapter()
    adapter.instrument()
    errors = adapter.recorder.errors  # the recorder is shared by every instance, for the process
    try:
        client = ag.client_for(base_url=fake_server.base_url)
        result = await ag.make_solver(client).run(task="What is 2 * 3?")
        await client.close()
        assert result.messages[-1].to_text() == "The answer is 6."
        assert adapter.recorder.errors == errors
        # INFO events the root logger's WARNING level hid before are still hidden from handlers.
        assert not [r for r in seen if r.name.startswith("autogen") and r.levelno < logging.WARNING]
    finally:
        adapter.uninstrument()
        root.removeHandler(handler)
    assert (events.level, list(events.filters)) == before
    from autogen_agentchat.teams import BaseGroupChat

    assert not hasattr(BaseGroupChat.run_stream, "__wrapped__")  # the team hook is gone


@pytest.fixture
async def fake_server() -> Any:
    from agentbolt.testing.fake_llm import FakeLLMServer

    async with FakeLLMServer(ag.calc_backend()) as server:
        yield server


def test_plugin_and_package_import_without_autogen() -> None:
    code = (
        "import sys, agentbolt_autogen.plugin, agentbolt_autogen; "
        "assert not [m for m in sys.modules if m.startswith(('autogen_', 'openai'))], sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


class ListSink:
    """Stands in for the runner's span sink (in-process tests without the gateway)."""

    def __init__(self) -> None:
        self.items: list[Any] = []

    def put(self, span: Any) -> None:
        self.items.append(span)

    def spans(self) -> list[t.Span]:
        return [s if isinstance(s, t.Span) else t.Span.from_otel(s) for s in self.items]


async def test_team_span_is_the_parent_of_turns_without_runtime_tracing(
    adapter: AutogenAdapter, fake_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUTOGEN_DISABLE_RUNTIME_TRACING", "true")  # read when the team's runtime is built
    sink = ListSink()
    with rollout_context(RolloutContext("r-team", "a-team", sink)):
        client = ag.client_for(base_url=fake_server.base_url)
        reward = await ag.calc_team({"question": "What is 4 * 5?", "answer": 20}, None, client=client)
    assert reward == 1.0
    spans = sink.spans()
    assert not [s for s in spans if s.name.startswith("autogen ")]  # no runtime spans
    own = [s for s in spans if "agentbolt.adapter" in s.attributes]
    (team,) = [s for s in own if s.name == "invoke_agent RoundRobinGroupChat"]
    turns = [s for s in own if kind(s) == semconv.KIND_AGENT and s is not team]
    assert [s.attributes[semconv.GEN_AI_AGENT_NAME] for s in turns] == ["solver", "checker"]
    assert all(s.parent_span_id == team.span_id for s in turns)
    assert {s.trace_id for s in own} == {team.trace_id}
    assert all(s.rollout_id == "r-team" and s.attempt_id == "a-team" for s in spans)


async def test_streamed_calls_are_llm_spans_without_a_response_id_and_say_so(
    adapter: AutogenAdapter, fake_server: Any
) -> None:
    from autogen_agentchat.agents import AssistantAgent

    sink = ListSink()
    client = ag.client_for(base_url=fake_server.base_url)
    agent = AssistantAgent(
        "streamer", model_client=client, tools=[ag.calculator], reflect_on_tool_use=True, model_client_stream=True
    )
    with (
        pytest.warns(AutogenCaptureWarning, match="model_client_stream=False"),
        rollout_context(RolloutContext("r-stream", "a-stream", sink)),
    ):
        result = await agent.run(task="What is 2 * 3?")
    await client.close()
    assert result.messages[-1].to_text() == "The answer is 6."
    llm = [s for s in sink.spans() if kind(s) == semconv.KIND_LLM]
    assert len(llm) == 2
    assert all(s.attributes["autogen.llm.stream"] and semconv.GEN_AI_RESPONSE_ID not in s.attributes for s in llm)
    assert all(s.attributes[semconv.GEN_AI_AGENT_NAME] == "streamer" for s in llm)
    assert sp.tool_call_ids(None, (llm[0],))  # the requested tool call is on the span
    assert sp.response_text(None, (llm[1],)) == "The answer is 6."
    assert all(s.end_time_ns >= s.start_time_ns for s in llm)
