"""No stored value stops a LightningRL step: hostile rewards (in a final or intermediate reward
span, or in ``Rollout.final_reward``), an absurd length or a value that makes processing raise
put their rollout in quarantine with a reason, and the rest of the batch trains.

The invariants are checked on generated batches (Hypothesis): for any hostile value at any place
in any rollout of any estimator's batch, ``process`` returns, the poisoned rollout and only it is
quarantined (reason, metrics, excluded calls agree), every other rollout yields rows, and every
advantage is finite.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lrl_traces import Trace

from agentbolt import semconv
from agentbolt.lightningrl import GRPO, RLOO, LightningRL, LightningRLConfig, ReinforcePlusPlus
from agentbolt.reward_validation import MAX_ABS_REWARD
from agentbolt.testing.hostile import HOSTILE_REWARDS, is_hostile
from agentbolt.types import Rollout, Span, Transition

REASONS = {"not_a_number", "non_finite", "too_large", "out_of_range"}

hostile = st.one_of(
    # None is no value at all (a malformed reward span, counted, or no final reward), not a refused one
    st.sampled_from([v for v in HOSTILE_REWARDS if v is not None]),
    st.floats(allow_nan=True, allow_infinity=True).filter(is_hostile),
    st.integers().filter(lambda n: abs(n) > MAX_ABS_REWARD),
    st.text(max_size=20),
    st.lists(st.floats(-1, 1), min_size=1, max_size=50),
    st.dictionaries(st.text(max_size=5), st.floats(-1, 1), min_size=1, max_size=3),
)


def _forced(span: Span, key: str, value: Any) -> Span:
    """``span`` with ``attributes[key] = value`` unvalidated (what a foreign writer could store)."""
    return span.model_construct(**{**dict(span), "attributes": {**span.attributes, key: value}})


def _batch(
    groups: int, size: int, poisoned: int, where: str, value: Any
) -> tuple[list[Rollout], dict[str, list[Span]]]:
    """``groups`` x ``size`` rollouts of two calls each, rewards in [0, 1]; rollout ``poisoned``
    carries ``value`` at ``where``."""
    rollouts, spans = [], {}
    for g in range(groups):
        for k in range(size):
            i = g * size + k
            tr = Trace(f"r{i}", group_id=f"g{g}")
            tr.llm([1, 2, 3], [4, 5])
            tr.llm([1, 2, 3, 4, 5, 6], [7])
            reward = tr.reward(0.1 * k, final=True)
            rollout = tr.rollout
            if i == poisoned:
                if where == "final_span":
                    tr.spans[-1] = _forced(reward, semconv.REWARD_VALUE, value)
                elif where == "final_dimension":  # no value: the primary of named dimensions
                    attrs = {k: v for k, v in reward.attributes.items() if k != semconv.REWARD_VALUE}
                    attrs[semconv.REWARD_PRIMARY] = "score"
                    attrs[semconv.REWARD_DIMENSIONS] = json.dumps({"score": value, "style": 0.5}, default=repr)
                    tr.spans[-1] = reward.model_construct(**{**dict(reward), "attributes": attrs})
                elif where == "intermediate_span":
                    step = tr.reward(0.5)
                    tr.spans[-1] = _forced(step, semconv.REWARD_VALUE, value)
                else:  # the rollout's own final reward (no final span)
                    tr.spans.remove(reward)
                    rollout = rollout.model_construct(**{**dict(rollout), "final_reward": value})
            rollouts.append(rollout)
            spans[rollout.rollout_id] = tr.spans
    return rollouts, spans


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    value=hostile,
    where=st.sampled_from(["final_span", "final_dimension", "intermediate_span", "rollout_final_reward"]),
    advantage=st.sampled_from(["grpo", "rloo", "reinforce_pp"]),
    credit=st.sampled_from(["final", "intermediate", "discounted"]),
    groups=st.integers(1, 3),
    size=st.integers(2, 3),
    data=st.data(),
)
def test_a_hostile_value_quarantines_its_rollout_and_the_rest_trains(
    value: Any, where: str, advantage: str, credit: str, groups: int, size: int, data: st.DataObject
) -> None:
    poisoned = data.draw(st.integers(0, groups * size - 1))
    rollouts, spans = _batch(groups, size, poisoned, where, value)
    lrl = LightningRL(LightningRLConfig(credit=credit, advantage=advantage))
    batch = lrl.process(rollouts, spans)
    report = batch.report
    [q] = report.quarantined
    assert q.rollout_id == f"r{poisoned}" and q.reason in REASONS and q.detail
    assert report.excluded.get("quarantined") == 2
    assert report.metrics()["lightningrl/quarantined"] == 1.0
    assert report.metrics()[f"lightningrl/quarantined/{q.reason}"] == 1.0
    trained = {row.rollout_id for row in batch.rows}
    assert trained == {r.rollout_id for r in rollouts} - {q.rollout_id}
    assert all(math.isfinite(t.advantage or 0.0) and math.isfinite(t.reward or 0.0) for t in batch.transitions)
    assert "quarantined rollout r" in report.summary()


@pytest.mark.parametrize("value", [1e308, -1e308, 1e200, 2e15])
def test_an_agent_return_stored_before_validation_is_quarantined_as_too_large(value: float) -> None:
    """The offline case of issue 38: a rollout whose agent returned 1e308 (stored by an older
    runner) no longer overflows the group's variance; it is quarantined and its group trains."""
    rollouts, spans = _batch(1, 4, 0, "rollout_final_reward", value)
    batch = LightningRL().process(rollouts, spans)
    assert [(q.rollout_id, q.reason) for q in batch.report.quarantined] == [("r0", "too_large")]
    assert {r.rollout_id for r in batch.rows} == {"r1", "r2", "r3"}


def test_reward_range_refuses_or_clips() -> None:
    rollouts, spans = _batch(1, 3, 1, "final_span", 5.0)
    refused = LightningRL(reward_range=(0.0, 1.0)).process(rollouts, spans)
    assert [(q.rollout_id, q.reason) for q in refused.report.quarantined] == [("r1", "out_of_range")]
    assert "reward_range [0, 1]" in refused.report.quarantined[0].detail
    clipped = LightningRL(reward_range=(0.0, 1.0), reward_out_of_range="clip").process(rollouts, spans)
    assert not clipped.report.quarantined
    assert {t.rollout_id: t.reward for t in clipped.transitions}["r1"] == 1.0
    assert clipped.report.rewards.get("rewards_clipped") == 1 or clipped.report.extraction.get("rewards_clipped") == 1
    with pytest.raises(ValueError, match="low <= high"):
        LightningRLConfig(reward_range=(1.0, 0.0))


def test_an_absurd_length_is_quarantined() -> None:
    tr = Trace("long", group_id="g")
    tr.llm([1] * (1 << 20), [2, 3])
    tr.reward(1.0, final=True)
    ok = Trace("ok", group_id="g")
    ok.llm([1], [2])
    ok.reward(0.0, final=True)
    batch = LightningRL().process([tr.rollout, ok.rollout], {"long": tr.spans, "ok": ok.spans})
    assert [(q.rollout_id, q.reason) for q in batch.report.quarantined] == [("long", "absurd_length")]
    assert [r.rollout_id for r in batch.rows] == ["ok"]


def test_a_value_that_makes_processing_raise_quarantines_only_its_rollout() -> None:
    """A malformed value no check foresees (here: a span whose attributes are not a mapping)."""
    bad = Trace("bad", group_id="g")
    bad.llm([1], [2])
    bad.reward(1.0, final=True)
    bad.spans[0] = bad.spans[0].model_construct(**{**dict(bad.spans[0]), "attributes": ["not", "a", "mapping"]})
    ok = Trace("ok", group_id="g")
    ok.llm([1], [2])
    ok.reward(0.0, final=True)
    batch = LightningRL().process([bad.rollout, ok.rollout], {"bad": bad.spans, "ok": ok.spans})
    [q] = batch.report.quarantined
    assert (q.rollout_id, q.reason) == ("bad", "error") and "AttributeError" in q.detail
    assert [r.rollout_id for r in batch.rows] == ["ok"]


def _transitions(rewards: list[float], group_of: list[int]) -> list[Transition]:
    return [
        Transition(rollout_id=f"r{i}", group_id=f"g{g}", index=0, prompt_ids=[1], response_ids=[2], reward=x)
        for i, (x, g) in enumerate(zip(rewards, group_of, strict=True))
    ]


finite = st.floats(allow_nan=False, allow_infinity=False)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(finite, st.integers(0, 2)), min_size=1, max_size=12), st.booleans())
def test_advantages_never_overflow(members: list[tuple[float, int]], transition_level: bool) -> None:
    """Any finite rewards, 1e308 included: no estimator raises or returns a non-finite advantage.
    GRPO is scale-free and never gives up a group; RLOO and REINFORCE++ leave a group out
    (``quarantined``, ``advantage_overflow``) only when its advantages are beyond the float range."""
    level = "transition" if transition_level else "rollout"
    transitions = _transitions([x for x, _ in members], [g for _, g in members])
    for estimator in (
        GRPO(level=level),
        GRPO(level=level, norm_std=False),
        RLOO(level=level),
        ReinforcePlusPlus(level=level),
    ):
        result = estimator.estimate(transitions)
        assert all(math.isfinite(t.advantage) for t in result.transitions if t.advantage is not None)
        assert len(result.transitions) + len(result.quarantined) == len(transitions)
        assert all(why.startswith("advantage_overflow: ") for why in result.quarantined.values())
        if isinstance(estimator, GRPO) and estimator.norm_std:
            assert not result.quarantined
            assert all(abs(t.advantage or 0.0) <= len(transitions) for t in result.transitions)


def test_grpo_on_huge_rewards_equals_grpo_on_their_scaled_values() -> None:
    huge = GRPO().estimate(_transitions([1e308, -1e308, 0.0, 5e307], [0, 0, 0, 0]))
    small = GRPO(epsilon=0.0).estimate(_transitions([1.0, -1.0, 0.0, 0.5], [0, 0, 0, 0]))
    assert [t.advantage for t in huge.transitions] == pytest.approx([t.advantage for t in small.transitions])


def test_rloo_leaves_out_only_the_group_that_overflows() -> None:
    result = RLOO().estimate(_transitions([1e308, -1e308, 1.0, 0.0], [0, 0, 1, 1]))
    assert set(result.quarantined) == {"r0", "r1"}
    assert [(t.rollout_id, t.advantage) for t in result.transitions] == [("r2", 1.0), ("r3", -1.0)]
