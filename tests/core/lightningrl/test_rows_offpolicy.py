"""Training rows, the staleness bound and the off-policy correction (core side; parity with
verl's own functions is in tests/verl/test_rollout_correction.py)."""

from __future__ import annotations

import math
import random

import pytest
from lrl_traces import Trace

from agentbolt import semconv
from agentbolt.errors import UserError
from agentbolt.lightningrl import (
    EmptyBatchError,
    LightningRL,
    LightningRLConfig,
    RolloutCorrection,
    loss_weights,
    rollout_correction,
    token_loss_weights,
    training_rows,
)
from agentbolt.types import Transition


def _trace(rid: str, reward: float, versions: list[int | None], *, group: str = "g", logprobs: bool = True) -> Trace:
    tr = Trace(rid, group_id=group)
    context = [1, 2]
    for k, version in enumerate(versions):
        response = [10 + k, 20 + k]
        span = tr.llm(context, response, version=version, logprobs=[-0.5, -0.25])
        if not logprobs:
            attrs = {k: v for k, v in span.attributes.items() if k != semconv.RESPONSE_LOGPROBS}
            tr.spans[-1] = span.model_copy(update={"attributes": attrs})
        context = [*context, *response, 3]
    tr.final(reward)
    return tr


def _batch(traces: list[Trace]) -> tuple[list, dict]:
    return [t.rollout for t in traces], {t.rollout.rollout_id: t.spans for t in traces}


# -- rows ------------------------------------------------------------------------------------------


def test_process_returns_rows_with_the_advantage_and_the_aggregation_weight() -> None:
    traces = [_trace("a", 1.0, [1, 1, 1]), _trace("b", 0.0, [1])]
    batch = LightningRL().process(*_batch(traces))
    assert [r.transition for r in batch.rows] == batch.transitions
    assert [r.advantage for r in batch.rows] == [t.advantage for t in batch.transitions]
    assert [r.loss_weight for r in batch.rows] == loss_weights(batch.transitions, "rollout-mean-token-mean")
    # each rollout weighs the same: 2 rollouts, rollout a has 6 trained tokens, b has 2
    assert [r.loss_weight for r in batch.rows] == pytest.approx([1 / 12] * 3 + [1 / 4])
    row = batch.rows[0]
    assert row.behaviour_logprobs == [-0.5, -0.25] and row.policy_version == 1 and row.group_id == "g"
    assert row.token_advantages() == [row.advantage] * 2 and row.n_tokens == 2


def test_merged_rows_weigh_only_their_trained_tokens() -> None:
    traces = [_trace("a", 1.0, [1, 1]), _trace("b", 0.0, [1])]
    batch = LightningRL(merge=True).process(*_batch(traces))
    merged = batch.rows[0]
    assert merged.response_mask == [1, 1, 0, 1, 1]  # response, observation token 3, response
    assert merged.token_loss_weights() == pytest.approx([1 / 8, 1 / 8, 0.0, 1 / 8, 1 / 8])


def test_training_rows_refuses_transitions_without_advantages() -> None:
    t = Transition(rollout_id="r", index=0, prompt_ids=[1], response_ids=[2], reward=1.0)
    with pytest.raises(UserError, match="no advantage"):
        training_rows([t])


def test_token_loss_weights_with_is_weights_and_rejected_tokens() -> None:
    masks = [[1, 1, 0], [1, 0, 0], [0, 0, 0]]
    out = token_loss_weights(["a", "a", "b"], masks, "token-mean", is_weights=[[2.0, 0.5, 9.0], [1.5, 1, 1], [1, 1, 1]])
    expected = [[2 / 3, 0.5 / 3, 0.0], [1.5 / 3, 0.0, 0.0], [0.0, 0.0, 0.0]]
    assert [pytest.approx(row) for row in expected] == out


# -- staleness -------------------------------------------------------------------------------------


def test_stale_calls_are_dropped_and_counted_never_trained() -> None:
    traces = [_trace("a", 1.0, [5, 4, 2]), _trace("b", 0.0, [5]), _trace("c", 0.0, [None])]
    batch = LightningRL(max_staleness=2).process(*_batch(traces), policy_version=6)
    trained = {(t.rollout_id, t.index) for t in batch.transitions}
    assert trained == {("a", 0), ("a", 1), ("b", 0)}  # version 2 is 4 behind; c has no version
    assert all(6 - t.policy_version <= 2 for t in batch.transitions)  # type: ignore[operator]
    report = batch.report
    assert report.excluded["stale"] == 2 and report.policy_version == 6
    assert report.staleness == {"1": 2, "2": 1}
    metrics = report.metrics()
    assert metrics["lightningrl/excluded/stale"] == 2.0 and metrics["lightningrl/staleness_max"] == 2.0
    assert "max_staleness" in report.summary()


def test_max_staleness_zero_is_on_policy_and_none_is_unbounded() -> None:
    traces = [_trace("a", 1.0, [3, 2]), _trace("b", 0.0, [3])]
    on_policy = LightningRL(max_staleness=0).process(*_batch(traces), policy_version=3)
    assert {t.policy_version for t in on_policy.transitions} == {3}
    unbounded = LightningRL().process(*_batch(traces), policy_version=3)
    assert len(unbounded.transitions) == 3 and unbounded.report.staleness == {"0": 2, "1": 1}


def test_max_staleness_needs_the_trained_version() -> None:
    with pytest.raises(UserError, match="policy_version"):
        LightningRL(max_staleness=1).process(*_batch([_trace("a", 1.0, [1])]))


def test_to_rows_applies_the_bound_to_transitions_collected_earlier() -> None:
    """A backend that collects per rollout (before knowing the trained version) bounds at to_rows."""
    traces = [_trace("a", 1.0, [1, 3]), _trace("b", 0.0, [3])]
    lrl = LightningRL(max_staleness=1)
    collected = lrl.collect(*_batch(traces))
    assert collected.rows == [] and all(t.advantage is None for t in collected.transitions)
    batch = lrl.to_rows(collected.transitions, policy_version=4, report=collected.report)
    assert [(t.rollout_id, t.index) for t in batch.transitions] == [("a", 1), ("b", 0)]
    assert batch.report.excluded == {"stale": 1} and batch.report.trained_calls == 2
    assert batch == LightningRL(max_staleness=1).to_rows(
        collected.transitions, policy_version=4, report=collected.report
    )


def test_everything_stale_raises_empty_batch_with_the_reason() -> None:
    with pytest.raises(EmptyBatchError, match="stale"):
        LightningRL(max_staleness=0).process(*_batch([_trace("a", 1.0, [1])]), policy_version=9)


def test_correction_leaves_out_calls_without_sampling_logprobs() -> None:
    traces = [_trace("a", 1.0, [1]), _trace("b", 0.0, [1], logprobs=False)]
    batch = LightningRL(rollout_is="token", allow_empty=True).process(*_batch(traces))
    assert [t.rollout_id for t in batch.transitions] == ["a"]
    assert batch.report.excluded == {"no_logprobs": 1}
    assert len(LightningRL(allow_empty=True).process(*_batch(traces)).transitions) == 2


# -- correction: config and formulas -----------------------------------------------------------------


def test_config_validates_correction_fields_with_verl_names() -> None:
    cfg = LightningRLConfig(
        rollout_is="sequence", rollout_is_threshold=3.0, rollout_rs="seq_sum_k1", rollout_rs_threshold="0.5_2.0"
    )
    assert cfg.correction == RolloutCorrection("sequence", 3.0, False, "seq_sum_k1", "0.5_2.0")
    assert LightningRLConfig().correction is None
    for bad, match in (
        ({"rollout_rs": "seq_sum_k9", "rollout_rs_threshold": 2.0}, "unknown rollout_rs"),
        ({"rollout_rs": "seq_sum_k1"}, "needs rollout_rs_threshold"),
        ({"rollout_rs": "seq_mean_k3", "rollout_rs_threshold": "0.1_2"}, "positive upper bound"),
        ({"rollout_is": "token", "rollout_is_threshold": "3_2"}, "lower <= upper"),
        ({"max_staleness": -1}, "max_staleness"),
    ):
        with pytest.raises(UserError, match=match):
            LightningRLConfig.from_value(bad)


def test_token_tis_caps_each_token_and_reports_what_it_did() -> None:
    behaviour = [[-1.0, -1.0, -1.0]]
    proximal = [[-1.0, -0.5, 2.0]]  # ratios 1, e^0.5 = 1.65, e^3 = 20.1
    out = rollout_correction(behaviour, proximal, [[1, 1, 1]], RolloutCorrection("token", 2.0))
    assert out.weights == [pytest.approx([1.0, math.exp(0.5), 2.0])]
    assert out.masks == [[1, 1, 1]]
    assert out.stats["is_clipped_frac"] == pytest.approx(1 / 3)
    assert out.stats["is_weight_max"] == 2.0


def test_sequence_tis_gives_a_row_one_weight_over_its_trained_tokens() -> None:
    behaviour = [[-1.0, -1.0, -1.0], [-1.0, -1.0]]
    proximal = [[-0.9, -1.0, -5.0], [-0.1, -0.1]]  # the masked token (-4.0) does not count
    out = rollout_correction(behaviour, proximal, [[1, 1, 0], [1, 1]], RolloutCorrection("sequence", 2.0))
    assert out.weights[0] == pytest.approx([math.exp(0.1), math.exp(0.1), 0.0])
    assert out.weights[1] == [2.0, 2.0]  # e^1.8 capped


def test_sequence_rejection_masks_whole_rows_and_icepop_zeroes_out_of_bounds() -> None:
    behaviour = [[-1.0, -1.0], [-1.0, -1.0]]
    proximal = [[-1.0, -0.9], [0.0, 0.0]]  # row 2: sum log r = 2, ratio e^2 outside [0.5, 2]
    rs = rollout_correction(
        behaviour, proximal, [[1, 1], [1, 1]], RolloutCorrection(None, 2.0, False, "seq_sum_k1", "0.5_2.0")
    )
    assert rs.masks == [[1, 1], [0, 0]] and rs.weights == [[1.0, 1.0], [0.0, 0.0]]
    assert rs.stats["rs_masked_frac"] == 0.5 and rs.stats["rs_masked_rows"] == 1.0
    icepop = rollout_correction(behaviour, proximal, [[1, 1], [1, 1]], RolloutCorrection("token", "0.5_2.0"))
    assert icepop.weights == [pytest.approx([1.0, math.exp(0.1)]), [0.0, 0.0]]


def test_correction_weights_are_nonnegative_and_capped_whatever_the_inputs() -> None:
    rng = random.Random(7)
    for _ in range(50):
        rows = [rng.randint(1, 6) for _ in range(rng.randint(1, 5))]
        behaviour = [[rng.uniform(-8, 0) for _ in range(n)] for n in rows]
        proximal = [[rng.uniform(-8, 0) for _ in range(n)] for n in rows]
        masks = [[rng.randint(0, 1) for _ in range(n)] for n in rows]
        level = rng.choice(["token", "sequence"])
        out = rollout_correction(behaviour, proximal, masks, RolloutCorrection(level, 3.0, False, "token_k3", 5.0))
        for wrow, mrow, orig in zip(out.weights, out.masks, masks, strict=True):
            assert all(0.0 <= w <= 3.0 for w in wrow)
            assert all(m <= o for m, o in zip(mrow, orig, strict=True))  # rejection only removes tokens
            assert all(w == 0.0 for w, m in zip(wrow, mrow, strict=True) if not m)
