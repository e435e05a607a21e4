"""Tool spans from a real LangGraph ToolNode: one call succeeds, one raises, one returns an error."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("langgraph")

from lc_agents import DevRun, run_dev, tool_agent, tool_backend

from agentbolt import semconv
from agentbolt.types import Span, StatusCode
from agentbolt_langchain import LangChainAdapter


@pytest.fixture(scope="module")
def run() -> Iterator[DevRun]:
    adapter = LangChainAdapter()
    adapter.instrument()
    try:
        yield run_dev(tool_agent, tool_backend(), [{"question": "the users table"}])
    finally:
        adapter.uninstrument()


def spans(run: DevRun) -> list[Span]:
    (rollout,) = run.rollouts
    return [s for s in run.spans[rollout.rollout_id] if s.attributes.get("agentbolt.adapter") == "langchain"]


def test_tool_spans_carry_name_call_id_and_status(run: DevRun) -> None:
    tools = {
        s.attributes[semconv.GEN_AI_TOOL_CALL_ID]: s
        for s in spans(run)
        if s.attributes.get(semconv.SPAN_KIND_ATTR) == "tool"
    }
    assert set(tools) == {"call_ok", "call_raises", "call_handled"}
    ok, raised, handled = tools["call_ok"], tools["call_raises"], tools["call_handled"]
    assert ok.name == "execute_tool lookup" and ok.attributes[semconv.GEN_AI_TOOL_NAME] == "lookup"
    assert ok.attributes[semconv.GEN_AI_OPERATION_NAME] == semconv.OP_EXECUTE_TOOL
    assert ok.status.code is StatusCode.UNSET
    # the tool raised: status ERROR with the exception (type, message, traceback)
    assert raised.status.code is StatusCode.ERROR and raised.status.message == "ValueError: no such table: usrs"
    assert raised.attributes[semconv.ERROR_TYPE] == "ValueError"
    (event,) = raised.events
    assert event.name == "exception" and event.attributes[semconv.EXCEPTION_TYPE] == "ValueError"
    assert "raise ValueError" in event.attributes[semconv.EXCEPTION_STACKTRACE]
    # handle_tool_error=True: the tool returned an error ToolMessage instead of raising
    assert handled.attributes[semconv.GEN_AI_TOOL_NAME] == "strict_lookup"
    assert handled.status.code is StatusCode.ERROR and "unknown table usrs" in handled.status.message


def test_tools_sit_under_the_tools_node_and_calls_under_the_agent_node(run: DevRun) -> None:
    own = spans(run)
    by_id = {s.span_id: s for s in own}
    for s in own:
        kind = s.attributes[semconv.SPAN_KIND_ATTR]
        if kind in ("tool", "llm"):
            parent = by_id[s.parent_span_id]  # type: ignore[index]
            assert parent.attributes[semconv.GEN_AI_AGENT_NAME] == ("tools" if kind == "tool" else "agent")
    batch = run.process(credit="final")
    assert [tr.agent_name for tr in batch.transitions] == ["agent", "agent"]


def test_air_penalises_the_call_that_requested_the_failed_tools(run: DevRun) -> None:
    batch = run.process(credit="air", credit_options={"tool_error": -1.0})
    first, second = batch.transitions
    assert first.reward == pytest.approx(1.0 - 2.0)  # R + two failed tool calls matched by tool call id
    assert second.reward == pytest.approx(1.0)
    assert batch.report.credit.get("air.tool_error.tool_call_id") == 2
