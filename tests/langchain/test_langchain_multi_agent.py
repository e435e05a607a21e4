"""Multi-agent selective optimization on a real LangGraph write -> check -> rewrite graph.

One ``Trainer.dev`` run (sync agent, ``graph.invoke`` in the runner's thread) feeds every test:
LightningRL with ``agent_match="write|rewrite"`` must train exactly the write/rewrite calls,
with exact token ids, rewards as the credit assigner says, and report the check calls as
``agent_not_selected``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("langgraph")

from lc_agents import BAD, GOOD, WRITE_REWARD, DevRun, run_dev, sql_agent, sql_backend

from agentbolt import semconv
from agentbolt.testing.fake_llm import FakeTokenizer
from agentbolt_langchain import LangChainAdapter

EASY, HARD = "names of users over 30", "names of users over 30 (hard)"
# Calls per rollout in seq order. Easy: write, check. Hard: write (bad), check (WRONG), rewrite, check.
EASY_AGENTS = ["write", "check"]
HARD_AGENTS = ["write", "check", "rewrite", "check"]
R_EASY, R_HARD = 1.0, 0.75  # sql_reward: 1 less 0.25 per rewrite


@pytest.fixture(scope="module")
def run() -> Iterator[DevRun]:
    adapter = LangChainAdapter()
    adapter.instrument()
    try:
        yield run_dev(sql_agent, sql_backend(), [{"question": EASY}, {"question": HARD}, {"question": EASY}])
    finally:
        adapter.uninstrument()


def hard_rollout(run: DevRun) -> str:
    return next(r.rollout_id for r in run.rollouts if r.input["question"] == HARD)


def test_every_call_gets_the_agent_name_of_its_node(run: DevRun) -> None:
    batch = run.process(credit="final")
    for rollout in run.rollouts:
        calls = [c.agent_name for c in next(e for e in batch.episodes if e.rollout_id == rollout.rollout_id).calls]
        assert calls == (HARD_AGENTS if rollout.input["question"] == HARD else EASY_AGENTS)
    assert all(c.response_id for e in batch.episodes for c in e.calls)  # joined by gen_ai.response.id
    assert batch.report.extraction.get("joined_by_response_id") == 2 + 4 + 2


def test_only_selected_agents_are_trained_with_exact_token_ids(run: DevRun) -> None:
    batch = run.process(credit="final", agent_match="write|rewrite")
    assert sorted(tr.agent_name for tr in batch.transitions) == ["rewrite", "write", "write", "write"]
    tok = FakeTokenizer()
    prompts = {tuple(tok.render_chat(body["messages"], body.get("tools"))) for body in run.requests}
    for tr in batch.transitions:
        assert tr.token_source.value == "exact"
        assert tuple(tr.prompt_ids) in prompts  # the ids the backend saw, not retokenized
        bad_write = tr.agent_name == "write" and tr.rollout_id == hard_rollout(run)
        assert tr.response_ids == tok.encode(BAD if bad_write else GOOD)
        assert tr.response_logprobs == pytest.approx(tok.expected_logprobs(tr.prompt_ids, tr.response_ids))
    # the check calls are reported, not silently dropped
    assert batch.report.excluded == {"agent_not_selected": 4}
    assert batch.report.per_agent["check"].excluded == {"agent_not_selected": 4}
    assert batch.report.per_agent["check"].trained == 0
    assert {e.agent_name for e in batch.report.examples if e.reason == "agent_not_selected"} == {"check"}


def rewards(run: DevRun, **options: Any) -> dict[tuple[str, str], float]:
    """(easy|hard, agent) -> reward of the selected calls."""
    batch = run.process(agent_match="write|rewrite", **options)
    hard = hard_rollout(run)
    out: dict[tuple[str, str], float] = {}
    for tr in batch.transitions:
        key = ("hard" if tr.rollout_id == hard else "easy", tr.agent_name or "")
        assert out.setdefault(key, tr.reward) == pytest.approx(tr.reward)  # both easy rollouts agree
    return out


def test_final_credit_gives_every_selected_call_the_return(run: DevRun) -> None:
    assert rewards(run, credit="final") == {
        ("easy", "write"): R_EASY,
        ("hard", "write"): R_HARD,
        ("hard", "rewrite"): R_HARD,
    }


def test_discounted_credit_counts_excluded_calls_and_the_emitted_reward(run: DevRun) -> None:
    # G_i = r_i + gamma * G_{i+1}, G_last = r_last + R, over every call (check calls included).
    g = 0.5
    easy_write = WRITE_REWARD[True] + g * R_EASY
    hard = [WRITE_REWARD[False], 0.0, 0.0, 0.0]  # r_i: the write node's reward targets its own call
    g3 = hard[3] + R_HARD
    g2 = hard[2] + g * g3
    g0 = hard[0] + g * (hard[1] + g * g2)
    assert rewards(run, credit="discounted", credit_options={"gamma": g}) == pytest.approx(
        {("easy", "write"): easy_write, ("hard", "write"): g0, ("hard", "rewrite"): g2}
    )


def test_intermediate_credit_adds_the_emitted_reward_to_its_call(run: DevRun) -> None:
    assert rewards(run, credit="intermediate") == pytest.approx(
        {
            ("easy", "write"): R_EASY + WRITE_REWARD[True],
            ("hard", "write"): R_HARD + WRITE_REWARD[False],
            ("hard", "rewrite"): R_HARD,
        }
    )
    batch = run.process(credit="intermediate", agent_match="write|rewrite")
    assert batch.report.rewards.get("rewards_target_response") == 3  # one per write call, none unattached


def test_one_trace_and_one_root_per_rollout_named_after_the_graph(run: DevRun) -> None:
    for rollout in run.rollouts:
        own = [s for s in run.spans[rollout.rollout_id] if s.attributes.get("agentbolt.adapter") == "langchain"]
        ids = {s.span_id for s in own}
        roots = [s for s in own if s.parent_span_id not in ids]
        assert [r.attributes[semconv.GEN_AI_AGENT_NAME] for r in roots] == ["sql_agent"]
        assert len({s.trace_id for s in own}) == 1
        nodes = [s for s in own if s.parent_span_id == roots[0].span_id]
        assert all(s.attributes[semconv.SPAN_KIND_ATTR] == semconv.KIND_AGENT for s in nodes)
        # the conditional edge (route) and LangGraph internals are not spans
        assert {s.attributes[semconv.GEN_AI_AGENT_NAME] for s in nodes} <= {"write", "check", "rewrite"}
        assert all(s.start_time_ns <= s.end_time_ns for s in own)
