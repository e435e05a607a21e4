"""Loss aggregation weights: the one primitive (``row_weights``) for every mode of LightningRLConfig."""

from __future__ import annotations

import math
from collections import defaultdict

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentbolt.errors import UserError
from agentbolt.lightningrl import LOSS_AGGREGATIONS, loss_weights, row_weights, token_count, token_weights
from agentbolt.types import Transition


def tr(rollout: str, n: int, *, mask: list[int] | None = None, index: int = 0) -> Transition:
    return Transition(rollout_id=rollout, index=index, prompt_ids=[1], response_ids=list(range(n)), response_mask=mask)


def test_known_weights() -> None:
    ts = [tr("a", 2), tr("a", 2, index=1), tr("b", 4)]  # a: two calls, 4 tokens; b: one call, 4 tokens
    assert loss_weights(ts, "token-mean") == [1 / 8, 1 / 8, 1 / 8]
    assert loss_weights(ts, "seq-mean-token-mean") == [1 / 6, 1 / 6, 1 / 12]
    assert loss_weights(ts, "seq-mean-token-sum") == [1 / 3, 1 / 3, 1 / 3]
    assert loss_weights(ts, "rollout-mean-token-mean") == [1 / 8, 1 / 8, 1 / 8]
    assert loss_weights(ts) == loss_weights(ts, "rollout-mean-token-mean"), "the per-rollout mean is the default"
    # a rollout with more calls does not weigh more: three calls vs one
    more = [tr("a", 2), tr("a", 2, index=1), tr("a", 2, index=2), tr("b", 2)]
    w = loss_weights(more)
    assert sum(w[i] * 2 for i in range(3)) == pytest.approx(0.5) and w[3] * 2 == pytest.approx(0.5)
    assert loss_weights(more, "token-mean")[0] * 6 == pytest.approx(0.75), "token mean lets the long rollout dominate"


def test_row_weights_are_per_row_and_ignore_empty_rows() -> None:
    assert row_weights(["r1", "r1", "r2"], [6, 4, 5]) == pytest.approx([1 / 20, 1 / 20, 1 / 10])
    assert row_weights(["r1", "r1", "r2"], [6, 4, 5], "token-mean") == pytest.approx([1 / 15] * 3)
    assert row_weights(["r1", "r1", "r2"], [6, 4, 5], "seq-mean-token-mean") == pytest.approx([1 / 18, 1 / 12, 1 / 15])
    assert row_weights(["r1", "r2"], [0, 5]) == pytest.approx([0.0, 1 / 5])
    for mode in LOSS_AGGREGATIONS:
        assert row_weights(["r1"], [0], mode) == [0.0]


def test_masks_and_empty_transitions() -> None:
    ts = [tr("a", 4, mask=[1, 0, 0, 1]), tr("b", 0)]
    assert token_count(ts[0]) == 2
    w = loss_weights(ts)
    assert w == [0.5, 0.0]
    assert token_weights(ts, w) == [[0.5, 0.0, 0.0, 0.5], []]
    assert loss_weights([], "token-mean") == [] and loss_weights([tr("a", 0)]) == [0.0]


def test_unknown_mode_lists_the_valid_ones() -> None:
    with pytest.raises(
        UserError,
        match="valid names: rollout-mean-token-mean, token-mean, seq-mean-token-mean, seq-mean-token-sum",
    ):
        loss_weights([tr("a", 3)], "sum")
    with pytest.raises(UserError, match="2 rollout ids for 1 token counts"):
        row_weights(["a", "b"], [1])


batches = st.lists(
    st.tuples(st.sampled_from("abcde"), st.lists(st.integers(0, 1), min_size=0, max_size=12)), min_size=1, max_size=20
)


def _ts(spec: list[tuple[str, list[int]]]) -> list[Transition]:
    return [tr(r, len(mask), mask=mask or None, index=i) for i, (r, mask) in enumerate(spec)]


@given(batches)
def test_rollout_mean_sums_to_one_and_weighs_rollouts_equally(spec: list[tuple[str, list[int]]]) -> None:
    ts = _ts(spec)
    w = loss_weights(ts, "rollout-mean-token-mean")
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
def test_token_and_seq_means_sum_to_one(spec: list[tuple[str, list[int]]]) -> None:
    ts = _ts(spec)
    has_tokens = any(token_count(t) for t in ts)
    for mode in ("token-mean", "seq-mean-token-mean"):
        total = math.fsum(w * token_count(t) for t, w in zip(ts, loss_weights(ts, mode), strict=True))
        assert total == pytest.approx(1.0 if has_tokens else 0.0)
    rows = sum(1 for t in ts if token_count(t))
    sums = loss_weights(ts, "seq-mean-token-sum")
    assert all(w == pytest.approx(1 / rows) for t, w in zip(ts, sums, strict=True) if token_count(t))
