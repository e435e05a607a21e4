"""LightningRL end to end: rollouts + spans → transitions with rewards, advantages and a report."""

from __future__ import annotations

import json
import math

import pytest
from lrl_traces import Trace

from agentbolt.errors import UserError
from agentbolt.lightningrl import (
    AIRCredit,
    BatchReport,
    EmptyBatchError,
    FinalCredit,
    LightningRL,
    loss_weights,
)
from agentbolt.types import AttemptStatus, RolloutSpec, Span, TokenSource


def sql_rollout(rid: str, reward: float, *, rewrites: int = 1, group: str = "task-1") -> Trace:
    """A Spider-like LangGraph rollout: write_query, check_query, then rewrite_query calls."""
    tr = Trace(rid, group_id=group)
    graph = tr.agent("graph")
    context = [1, 2, 3]
    for node in ["write_query", "check_query"] + ["rewrite_query"] * rewrites:
        agent = tr.agent(node, parent=graph)
        response = [len(context) + 100]
        gw = tr.llm(context, response)
        tr.framework_llm(gw.attributes["gen_ai.response.id"], parent=agent)  # type: ignore[arg-type]
        context = [*context, *response, 7]
    tr.final(reward)
    return tr


def test_multi_agent_selective_training_with_rollout_level_grpo() -> None:
    traces = [
        sql_rollout("r1", 1.0, rewrites=3),
        sql_rollout("r2", 0.0),
        sql_rollout("r3", 0.0),
        sql_rollout("r4", 1.0),
    ]
    lrl = LightningRL(credit="final", advantage="grpo", agent_match=r"^(write|rewrite)_query$")
    batch = lrl.process([t.rollout for t in traces], {t.rollout.rollout_id: t.spans for t in traces})

    assert {t.agent_name for t in batch.transitions} == {"write_query", "rewrite_query"}
    by_rollout: dict[str, list[float]] = {}
    for t in batch.transitions:
        assert t.token_source == TokenSource.EXACT and t.group_id == "task-1"
        by_rollout.setdefault(t.rollout_id, []).append(t.advantage)  # type: ignore[arg-type]
    assert [len(v) for v in by_rollout.values()] == [4, 2, 2, 2]  # r1 made 3 rewrites
    expected = 0.5 / (math.sqrt(1 / 3) + 1e-6)  # one advantage per rollout despite r1's extra calls
    assert by_rollout["r1"] == pytest.approx([expected] * 4)
    assert by_rollout["r2"] == pytest.approx([-expected] * 2)
    assert [t.reward for t in batch.transitions if t.rollout_id == "r1"] == [1.0] * 4

    report = batch.report
    assert report.rollouts == 4 and report.calls == 14 and report.trained_calls == 10
    assert report.excluded == {"agent_not_selected": 4}
    assert report.per_agent["check_query"].model_dump() == {
        "calls": 4,
        "trained": 0,
        "excluded": {"agent_not_selected": 4},
    }
    assert report.per_agent["rewrite_query"].trained == 6
    assert report.final_reward_sources == {"span": 4}
    assert report.advantage["groups"] == 1
    assert report.extraction["joined_by_response_id"] == 14
    # the per-rollout mean keeps r1 from dominating the loss
    weights = loss_weights(batch.transitions)
    r1 = sum(w for t, w in zip(batch.transitions, weights, strict=True) if t.rollout_id == "r1")
    assert r1 == pytest.approx(0.25)


def test_report_round_trips_through_json_and_flattens_to_metrics() -> None:
    tr = sql_rollout("r1", 1.0)
    batch = LightningRL(agent_match="write").process([tr.rollout], {"r1": tr.spans})
    again = BatchReport.model_validate_json(batch.report.model_dump_json())
    assert again == batch.report
    metrics = batch.report.metrics()
    assert metrics["lightningrl/trained_calls"] == 2.0
    assert metrics["lightningrl/excluded/agent_not_selected"] == 1.0
    assert metrics["lightningrl/agent/check_query/calls"] == 1.0
    assert all(isinstance(v, float) for v in metrics.values())
    json.dumps(metrics)


def test_empty_batch_is_an_explicit_error_naming_reasons_and_counts() -> None:
    tr = Trace("r1")
    tr.llm([1], [2], source="missing")
    tr.llm([1], [2], source="missing")
    tr.llm([1], [2], source="retokenized")
    tr.final(1.0)
    with pytest.raises(EmptyBatchError) as info:
        LightningRL().process([tr.rollout], {"r1": tr.spans})
    message = str(info.value)
    assert "excluded 2 x no_token_ids" in message and "excluded 1 x retokenized" in message
    assert "allow_retokenized=True" in message
    assert info.value.report.excluded == {"no_token_ids": 2, "retokenized": 1}
    assert {e.reason for e in info.value.report.examples} == {"no_token_ids", "retokenized"}

    empty = Trace("r2")
    empty.final(1.0)
    with pytest.raises(EmptyBatchError, match="no LLM-call spans"):
        LightningRL().process([empty.rollout], {})
    allowed = LightningRL(allow_empty=True).process([tr.rollout], {"r1": tr.spans})
    assert allowed.transitions == [] and allowed.report.excluded["no_token_ids"] == 2


def test_agent_match_selecting_nothing_is_reported() -> None:
    tr = sql_rollout("r1", 1.0)
    with pytest.raises(EmptyBatchError, match=r"excluded 3 x agent_not_selected") as info:
        LightningRL(agent_match=["planner"]).process([tr.rollout], {"r1": tr.spans})
    assert "write_query: 0/1" in str(info.value)


def test_missing_reward_drop_or_fill_is_reported_never_silent() -> None:
    good = Trace("r1")
    good.llm([1], [2])
    good.final(1.0)
    missing = Trace("r2")
    missing.llm([1], [2])
    rollouts, spans = [good.rollout, missing.rollout], {"r1": good.spans, "r2": missing.spans}

    dropped = LightningRL().process(rollouts, spans)
    assert [t.rollout_id for t in dropped.transitions] == ["r1"]
    assert dropped.report.excluded == {"missing_reward": 1}
    assert dropped.report.final_reward_sources == {"span": 1, "missing": 1}

    filled = LightningRL(missing_reward="fill", fill_value=-1.0).process(rollouts, spans)
    assert [(t.rollout_id, t.reward) for t in filled.transitions] == [("r1", 1.0), ("r2", -1.0)]
    assert filled.report.final_reward_sources == {"span": 1, "filled": 1}
    assert [t.advantage for t in filled.transitions] == pytest.approx(
        [1 / (math.sqrt(2) + 1e-6)] * 1 + [-1 / (math.sqrt(2) + 1e-6)]
    )
    with pytest.raises(UserError, match="fill_value"):
        LightningRL(missing_reward="fill")


def test_intermediate_rewards_on_untrained_calls_are_counted() -> None:
    tr = Trace("r1")
    tr.llm([1], [2], agent_name="a")
    tr.llm([3], [4], agent_name="b")
    tr.reward(0.5)  # lands on b's call, which is not trained
    tr.final(1.0)
    batch = LightningRL(credit="intermediate", agent_match=["a"]).process([tr.rollout], {"r1": tr.spans})
    assert [t.reward for t in batch.transitions] == [1.0]
    assert batch.report.rewards["on_untrained_calls"] == 1


def test_air_credit_components_reach_transition_metadata() -> None:
    tr = Trace("r1")
    tr.llm([1], [2], tool_calls=["c1"])
    tr.tool("search", call_id="c1", error=True)
    tr.llm([1, 2, 9], [3])
    tr.final(1.0)
    batch = LightningRL(credit="air", credit_options={"tool_error": -0.5}, advantage="grpo").process(
        [tr.rollout], [*tr.spans]
    )
    first, second = batch.transitions
    assert (first.reward, second.reward) == (0.5, 1.0)
    assert first.metadata["credit"] == {"final": 1.0, "air.tool_error": -0.5}
    assert batch.report.credit == {"air.tool_error.tool_call_id": 1}
    # one rollout in its group, per-call credit: x - mean over the rollout, no std scaling
    assert (first.advantage, second.advantage) == (-0.25, 0.25)


def test_merge_in_the_pipeline() -> None:
    traces = [sql_rollout("r1", 1.0, rewrites=2), sql_rollout("r2", 0.0)]
    batch = LightningRL(agent_match=["rewrite_query"], merge=True).process(
        [t.rollout for t in traces], {t.rollout.rollout_id: t.spans for t in traces}
    )
    merged = [t for t in batch.transitions if t.rollout_id == "r1"]
    assert len(merged) == 1 and merged[0].metadata["merged_indices"] == [2, 3]
    assert merged[0].response_mask == [1, 0, 1]  # response, observation token 7, response
    assert batch.report.merge["merged"] == 1
    assert batch.report.transitions == 2 and batch.report.trained_calls == 3


def test_configuration_errors() -> None:
    with pytest.raises(UserError, match="credit_options"):
        LightningRL(credit=FinalCredit(), credit_options={"gamma": 1})
    with pytest.raises(UserError, match="valid names"):
        LightningRL(advantage="ppo")
    with pytest.raises(UserError, match="max_length"):
        LightningRL(max_length=0)
    with pytest.raises(UserError, match="regular expression"):
        LightningRL(agent_match="(")
    lrl = LightningRL(credit=AIRCredit(), advantage_options={"level": "transition"})
    assert lrl.advantage.level == "transition"  # type: ignore[attr-defined]
    with pytest.raises(UserError, match="rollout_id"):
        lrl.process([], [Span.create("x")])


async def test_from_store_reads_final_attempts_in_one_batch() -> None:
    from agentbolt.store.memory import MemoryStore

    store = MemoryStore()
    try:
        await store.enqueue([RolloutSpec(rollout_id=f"r{i}", task_id="t", group_id="g") for i in range(2)])
        for i, reward in enumerate((1.0, 0.0)):
            (claim,) = await store.dequeue("w1")
            rid, aid = claim.rollout.rollout_id, claim.attempt.attempt_id
            tr = Trace(rid, attempt_id=aid)
            tr.llm([i], [i + 1])
            tr.final(reward)
            unstored = [s.model_copy(update={"seq": None}) for s in tr.spans]
            await store.add_spans(unstored)
            await store.finish_attempt(aid, AttemptStatus.SUCCEEDED, reward=reward)
        batch = await LightningRL().from_store(store, ["r0", "r1"])
    finally:
        await store.close()
    assert [(t.rollout_id, t.reward, t.prompt_ids) for t in batch.transitions] == [("r0", 1.0, [0]), ("r1", 0.0, [1])]
    assert batch.transitions[0].advantage == pytest.approx(1 / (math.sqrt(2) + 1e-6))
    assert batch.report.final_reward_sources == {"span": 2}
