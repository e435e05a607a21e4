"""Loss aggregation weights: per-rollout mean, token mean, sequence mean."""

from __future__ import annotations

import math
from collections import defaultdict

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentbolt.errors import UserError
from agentbolt.lightningrl import loss_weights, per_rollout_mean, seq_mean, token_count, token_mean, token_weights
from agentbolt.types import Transition


def tr(rollout: str, n: int, *, mask: list[int] | None = None, index: int = 0) -> Transition:
    return Transition(rollout_id=rollout, index=index, prompt_ids=[1], response_ids=list(range(n)), response_mask=mask)


def test_known_weights() -> None:
    ts = [tr("a", 2), tr("a", 2, index=1), tr("b", 4)]  # a: two calls, 4 tokens; b: one call, 4 tokens
    assert token_mean(ts) == [1 / 8, 1 / 8, 1 / 8]
    assert seq_mean(ts) == [1 / 6, 1 / 6, 1 / 12]
    assert per_rollout_mean(ts) == [1 / 8, 1 / 8, 1 / 8]
    assert per_rollout_mean(ts, within="seq") == [1 / 8, 1 / 8, 1 / 8]
    # a rollout with more calls does not weigh more: three calls vs one
    more = [tr("a", 2), tr("a", 2, index=1), tr("a", 2, index=2), tr("b", 2)]
    w = per_rollout_mean(more)
    assert sum(w[i] * 2 for i in range(3)) == pytest.approx(0.5) and w[3] * 2 == pytest.approx(0.5)
    assert token_mean(more)[0] * 6 == pytest.approx(0.75), "token mean lets the long rollout dominate"


def test_masks_and_empty_transitions() -> None:
    ts = [tr("a", 4, mask=[1, 0, 0, 1]), tr("b", 0)]
    assert token_count(ts[0]) == 2
    w = per_rollout_mean(ts)
    assert w == [0.5, 0.0]
    assert token_weights(ts, w) == [[0.5, 0.0, 0.0, 0.5], []]
    assert token_mean([]) == [] and per_rollout_mean([tr("a", 0)]) == [0.0]


def test_loss_weights_by_name() -> None:
    ts = [tr("a", 3)]
    assert loss_weights(ts, "seq_mean") == seq_mean(ts)
    with pytest.raises(UserError, match="valid names: per_rollout_mean, seq_mean, token_mean"):
        loss_weights(ts, "sum")


batches = st.lists(
    st.tuples(st.sampled_from("abcde"), st.lists(st.integers(0, 1), min_size=0, max_size=12)), min_size=1, max_size=20
)


def _ts(spec: list[tuple[str, list[int]]]) -> list[Transition]:
    return [tr(r, len(mask), mask=mask or None, index=i) for i, (r, mask) in enumerate(spec)]


@given(batches)
def test_per_rollout_mean_sums_to_one_and_weighs_rollouts_equally(spec: list[tuple[str, list[int]]]) -> None:
    ts = _ts(spec)
    for within in ("token", "seq"):
        w = per_rollout_mean(ts, within=within)  # type: ignore[arg-type]
        per_rollout: dict[str, float] = defaultdict(float)
        for t, wt in zip(ts, w, strict=True):
            assert wt >= 0
            per_rollout[t.rollout_id] += wt * token_count(t)
        total = math.fsum(per_rollout.values())
        if any(token_count(t) for t in ts):
            assert total == pytest.approx(1.0)
            shares = [v for v in per_rollout.values() if v]
            assert all(s == pytest.approx(1 / len(shares)) for s in shares)
        else:
            assert total == 0.0


@given(batches)
def test_token_and_seq_mean_sum_to_one(spec: list[tuple[str, list[int]]]) -> None:
    ts = _ts(spec)
    has_tokens = any(token_count(t) for t in ts)
    for fn in (token_mean, seq_mean):
        total = math.fsum(w * token_count(t) for t, w in zip(ts, fn(ts), strict=True))
        assert total == pytest.approx(1.0 if has_tokens else 0.0)
