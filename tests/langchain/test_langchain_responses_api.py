"""LangChain's ``ChatOpenAI(use_responses_api=True)`` through the gateway's ``/v1/responses``: the
LangGraph SQL agent's calls keep exact token ids and the node that made each one."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph
from lc_agents import BAD, GOOD, SqlState, run_dev, sql_backend

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.lightningrl import LightningRL
from agentbolt_langchain import LangChainAdapter


def _graph(llm: ChatOpenAI) -> Any:
    """write -> check -> (rewrite -> check)*, reading replies with ``.text`` (Responses API
    messages carry content blocks)."""

    def write(state: SqlState) -> SqlState:
        return {"query": llm.invoke(f"Write a SQL query for: {state['question']}").text, "rewrites": 0}

    def check(state: SqlState) -> SqlState:
        return {"verdict": llm.invoke(f"Check this SQL query: {state['query']}").text}

    def rewrite(state: SqlState) -> SqlState:
        msg = llm.invoke(f"Rewrite this SQL query: {state['query']} ({state['verdict']})")
        return {"query": msg.text, "rewrites": state["rewrites"] + 1}

    graph = StateGraph(SqlState)
    graph.add_node("write", write)
    graph.add_node("check", check)
    graph.add_node("rewrite", rewrite)
    graph.add_edge(START, "write")
    graph.add_edge("write", "check")
    graph.add_conditional_edges("check", lambda s: END if s["verdict"] == "OK" else "rewrite")
    graph.add_edge("rewrite", "check")
    return graph.compile()


def _agent(streaming: bool) -> Any:
    def agent(task: dict[str, Any], resources: t.Resources) -> float:
        assert resources.llm is not None
        llm = ChatOpenAI(
            base_url=resources.llm.base_url,
            api_key="x",
            model=resources.llm.model,
            max_retries=0,
            use_responses_api=True,
            streaming=streaming,
        )
        final = _graph(llm).invoke({"question": task["question"]})
        return 1.0 if final["query"] == GOOD else 0.0

    return agent


@pytest.mark.parametrize("streaming", [False, True], ids=["invoke", "stream"])
def test_responses_api_calls_have_exact_ids_and_node_names(streaming: bool) -> None:
    adapter = LangChainAdapter()
    adapter.instrument()
    try:
        run = run_dev(_agent(streaming), sql_backend(), [{"question": "list users"}, {"question": "a hard one"}])
    finally:
        adapter.uninstrument()
    batch = LightningRL(credit="final", advantage="grpo", allow_empty=True).process(run.rollouts, run.spans)
    names: dict[str, list[str | None]] = {}
    for episode in batch.episodes:
        names[episode.rollout.input["question"]] = [c.agent_name for c in episode.calls]
        for call in episode.calls:
            assert call.token_source is t.TokenSource.EXACT
            assert call.gateway_span is not None
            assert call.gateway_span.attributes[semconv.LLM_API] == "responses"
    assert names == {"list users": ["write", "check"], "a hard one": ["write", "check", "rewrite", "check"]}
    assert all(r.final_reward == 1.0 for r in run.rollouts)
    hard = next(e for e in batch.episodes if e.rollout.input["question"] == "a hard one")
    assert BAD in str(hard.calls[1].gateway_span.attributes[semconv.GEN_AI_INPUT_MESSAGES])  # check saw the bad query
