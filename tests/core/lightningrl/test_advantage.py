"""Advantage estimators (GRPO, RLOO, REINFORCE++) at rollout and transition level."""

from __future__ import annotations

import math
from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentbolt.errors import SchemaError, UserError
from agentbolt.lightningrl import GRPO, RLOO, AdvantageEstimator, ReinforcePlusPlus, get_advantage_estimator
from agentbolt.types import Transition


def tr(rollout: str, reward: float | None, *, group: str | None = "g", index: int = 0) -> Transition:
    return Transition(rollout_id=rollout, group_id=group, index=index, prompt_ids=[1], response_ids=[2], reward=reward)


def batch(spec: dict[str, tuple[str | None, list[float | None]]]) -> list[Transition]:
    """{rollout: (group, [reward of each call])} -> transitions."""
    return [tr(r, x, group=g, index=i) for r, (g, xs) in spec.items() for i, x in enumerate(xs)]


def adv(result_transitions: list[Transition]) -> dict[tuple[str, int], float]:
    return {(t.rollout_id, t.index): t.advantage for t in result_transitions}  # type: ignore[misc]


SQRT3 = math.sqrt(1 / 3)


def test_grpo_rollout_level_one_advantage_per_rollout() -> None:
    ts = batch({"a": ("g", [1.0, 1.0, 1.0]), "b": ("g", [0.0]), "c": ("g", [0.0, 0.0]), "d": ("g", [1.0])})
    res = GRPO().estimate(ts)
    a = adv(res.transitions)
    # returns 1, 0, 0, 1: mean 0.5, sample std sqrt(1/3), whatever the number of calls
    expected = 0.5 / (SQRT3 + 1e-6)
    assert a[("a", 0)] == a[("a", 1)] == a[("a", 2)] == pytest.approx(expected)
    assert a[("b", 0)] == a[("c", 1)] == pytest.approx(-expected)
    assert res.stats["groups"] == 1 and res.stats["rollouts"] == 4


def test_rollout_level_vs_v0_transition_level() -> None:
    ts = batch({"long": ("g", [1.0, 1.0, 1.0]), "short": ("g", [0.0])})
    rollout_level = adv(GRPO(epsilon=0).estimate(ts).transitions)
    assert rollout_level[("long", 0)] == pytest.approx(1 / math.sqrt(2))
    assert rollout_level[("short", 0)] == pytest.approx(-1 / math.sqrt(2))
    # v0: four samples [1, 1, 1, 0], mean 0.75, std 0.5: the long rollout dominates the baseline
    v0 = adv(GRPO(level="transition", epsilon=0).estimate(ts).transitions)
    assert v0[("long", 0)] == pytest.approx(0.5)
    assert v0[("short", 0)] == pytest.approx(-1.5)


def test_grpo_without_std_and_per_call_credit() -> None:
    ts = batch({"a": ("g", [2.0, 0.0]), "b": ("g", [0.0])})
    # s_a = 1, s_b = 0, mu = 0.5; transitions keep their own credit
    a = adv(GRPO(norm_std=False).estimate(ts).transitions)
    assert a == {("a", 0): 1.5, ("a", 1): -0.5, ("b", 0): -0.5}


@pytest.mark.parametrize(
    "est", [GRPO(), RLOO(), ReinforcePlusPlus(), GRPO(level="transition"), RLOO(level="transition")]
)
def test_groups_of_one_and_all_equal_groups_get_zero(est: AdvantageEstimator) -> None:
    ts = batch(
        {
            "solo": ("g1", [0.7, 0.7]),
            "x": ("g2", [0.1]),
            "y": ("g2", [0.1, 0.1, 0.1]),  # 0.1 * 3 / 3 != 0.1 in floats: must still be exactly 0
            "z": ("g2", [0.1]),
        }
    )
    res = est.estimate(ts)
    assert all(t.advantage == 0.0 for t in res.transitions)
    assert res.stats["singleton_groups"] == 1 and res.stats["zero_variance_groups"] == 1


def test_ungrouped_rollouts_are_their_own_group_and_reported() -> None:
    res = GRPO().estimate(batch({"a": (None, [1.0]), "b": (None, [0.0])}))
    assert [t.advantage for t in res.transitions] == [0.0, 0.0]
    assert res.stats["ungrouped_rollouts"] == 2 and res.stats["singleton_groups"] == 2


def test_missing_rewards_drop_fill_or_error() -> None:
    ts = batch({"a": ("g", [1.0]), "b": ("g", [None]), "c": ("g", [0.0])})
    dropped = GRPO().estimate(ts)
    assert [t.rollout_id for t in dropped.transitions] == ["a", "c"]
    assert [t.rollout_id for t in dropped.dropped] == ["b"] and dropped.stats["dropped_missing_reward"] == 1
    filled = GRPO(missing="fill", fill_value=0.0).estimate(ts)
    assert len(filled.transitions) == 3 and filled.stats["filled_missing_reward"] == 1
    assert filled.transitions[1].reward == 0.0
    with pytest.raises(SchemaError, match="no reward"):
        GRPO(missing="error").estimate(ts)
    with pytest.raises(UserError, match="fill_value"):
        GRPO(missing="fill")


def test_non_finite_rewards_and_inconsistent_groups_are_errors() -> None:
    with pytest.raises(SchemaError, match="non-finite"):
        GRPO().estimate([tr("a", float("inf"))])
    with pytest.raises(SchemaError, match="groups"):
        GRPO().estimate([tr("a", 1.0, group="g1"), tr("a", 1.0, group="g2", index=1)])


def test_rloo_known_values() -> None:
    ts = batch({"a": ("g", [1.0, 1.0]), "b": ("g", [0.0]), "c": ("g", [0.5])})
    a = adv(RLOO().estimate(ts).transitions)
    assert a == {("a", 0): 0.75, ("a", 1): 0.75, ("b", 0): -0.75, ("c", 0): 0.0}


def test_reinforce_pp_subtracts_group_mean_then_whitens_the_batch() -> None:
    ts = batch({"a": ("g1", [1.0]), "b": ("g1", [0.0, 0.0]), "c": ("g2", [1.0]), "d": ("g2", [1.0])})
    a = adv(ReinforcePlusPlus(epsilon=0).estimate(ts).transitions)
    # d = 0.5, -0.5, 0, 0 over four rollouts: mean 0, sample std sqrt(1/6)
    scale = math.sqrt(1 / 6)
    assert a[("a", 0)] == pytest.approx(0.5 / scale)
    assert a[("b", 0)] == a[("b", 1)] == pytest.approx(-0.5 / scale)
    assert a[("c", 0)] == a[("d", 0)] == 0.0
    raw = adv(ReinforcePlusPlus(whiten=False).estimate(ts).transitions)
    assert raw[("a", 0)] == 0.5


def test_registry_names_and_options() -> None:
    est = get_advantage_estimator("grpo", level="transition", norm_std=False)
    assert isinstance(est, GRPO) and est.level == "transition" and not est.norm_std
    assert isinstance(get_advantage_estimator("reinforce_pp"), ReinforcePlusPlus)
    with pytest.raises(UserError, match="valid names: grpo, reinforce_pp, rloo"):
        get_advantage_estimator("ppo")
    with pytest.raises(UserError, match="level"):
        GRPO(level="token")  # type: ignore[arg-type]


# --- properties --------------------------------------------------------------------------------

rewards = st.one_of(st.sampled_from([0.0, 1.0, 0.5, -1.0]), st.floats(-100, 100))
# {group: [rollout: [n_calls, reward]]}
constant_credit_batches = st.dictionaries(
    st.sampled_from(["g1", "g2", "g3", "g4"]),
    st.lists(st.tuples(st.integers(1, 4), rewards), min_size=1, max_size=6),
    min_size=1,
)


def _build(groups: dict[str, list[tuple[int, float]]]) -> list[Transition]:
    return [
        tr(f"{g}-{j}", x, group=g, index=i)
        for g, rollouts in groups.items()
        for j, (n, x) in enumerate(rollouts)
        for i in range(n)
    ]


def _per_rollout(ts: list[Transition]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = defaultdict(list)
    for t in ts:
        assert t.advantage is not None and math.isfinite(t.advantage)
        out[t.rollout_id].append(t.advantage)
    return out


@settings(max_examples=80, deadline=None)
@given(constant_credit_batches, st.sampled_from(["grpo", "rloo", "reinforce_pp"]))
def test_rollout_level_gives_one_finite_advantage_per_rollout(groups: dict, name: str) -> None:
    res = get_advantage_estimator(name).estimate(_build(groups))
    for values in _per_rollout(res.transitions).values():
        assert len(set(values)) == 1


@settings(max_examples=80, deadline=None)
@given(constant_credit_batches, st.sampled_from(["grpo", "rloo"]), st.sampled_from(["rollout", "transition"]))
def test_advantages_have_zero_mean_within_each_group(groups: dict, name: str, level: str) -> None:
    res = get_advantage_estimator(name, level=level).estimate(_build(groups))
    by_group: dict[str, list[tuple[float, float]]] = defaultdict(list)
    per_rollout = _per_rollout(res.transitions)
    for rid, values in per_rollout.items():
        group = rid.rsplit("-", 1)[0]
        if level == "rollout":
            by_group[group].append((values[0], 1.0))  # each rollout once
        else:
            by_group[group].extend((v, 1.0) for v in values)
    for values in by_group.values():
        assert math.fsum(v for v, _ in values) == pytest.approx(0.0, abs=1e-6 * max(1.0, len(values)))


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["g1", "g2", "g3"]),
        st.lists(st.lists(rewards, min_size=1, max_size=4), min_size=1, max_size=5),
        min_size=1,
    )
)
def test_grpo_per_call_credit_is_zero_mean_per_group_with_rollouts_weighted_equally(groups: dict) -> None:
    ts = [
        tr(f"{g}-{j}", x, group=g, index=i)
        for g, ros in groups.items()
        for j, xs in enumerate(ros)
        for i, x in enumerate(xs)
    ]
    per_rollout = _per_rollout(GRPO().estimate(ts).transitions)
    by_group: dict[str, list[float]] = defaultdict(list)
    for rid, values in per_rollout.items():
        by_group[rid.rsplit("-", 1)[0]].append(math.fsum(values) / len(values))
    for means in by_group.values():
        assert math.fsum(means) == pytest.approx(0.0, abs=1e-6 * len(means) * 100)


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(  # rewards on a grid: whitening subnormal spreads is meaningless
        st.sampled_from(["g1", "g2", "g3", "g4"]),
        st.lists(st.tuples(st.integers(1, 4), st.integers(-800, 800).map(lambda k: k / 8)), min_size=1, max_size=6),
        min_size=1,
    )
)
def test_reinforce_pp_is_whitened_across_the_batch(groups: dict) -> None:
    per_rollout = _per_rollout(ReinforcePlusPlus(epsilon=0.0).estimate(_build(groups)).transitions)
    values = [v[0] for v in per_rollout.values()]
    assert math.fsum(values) == pytest.approx(0.0, abs=1e-6 * len(values))
    if len(values) > 1 and len(set(values)) > 1:
        mean = math.fsum(values) / len(values)
        std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))
        assert std == pytest.approx(1.0, rel=1e-3)
