"""Loss aggregation as weights: how a batch of per-token losses becomes one scalar.

The one primitive every algorithm uses (agentbolt-torch's updater, agentbolt-verl's per-rollout
loss): :func:`row_weights` gives one weight per row (a transition, or a verl batch row) that
applies to **each** of its counted response tokens (``response_mask`` 1, or every token without
a mask). An algorithm then computes, framework-free::

    loss = Σ_r  w_r · Σ_k mask_{r,k} · token_loss_{r,k}

With n_r the counted tokens of row r, the weights satisfy Σ_r w_r · n_r = 1 for the mean modes
on any batch with at least one counted token; rows with no counted token get weight 0. The
modes are verl's ``loss_agg_mode`` names plus one of ours:

- ``rollout-mean-token-mean`` (default): every rollout weighs the same (J rollouts with
  tokens), tokens averaged inside it, so a rollout with many calls gets no more weight than one
  with a single call: ``w_r = 1 / (J · N_j)`` (N_j counted tokens of rollout j).
- ``token-mean``: every token of the batch weighs the same: ``w_r = 1 / Σ n``.
- ``seq-mean-token-mean``: every row weighs the same, tokens averaged inside it:
  ``w_r = 1 / (T · n_r)`` (T rows with tokens).
- ``seq-mean-token-sum``: every row weighs the same, tokens summed inside it: ``w_r = 1 / T``.

:class:`~agentbolt.lightningrl.LightningRLConfig` ``.loss_aggregation`` picks the mode;
:func:`loss_weights` and :func:`token_weights` apply it to :class:`~agentbolt.types.Transition` lists.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, get_args

from ..errors import UserError
from ..types import Transition

__all__ = [
    "DEFAULT_LOSS_AGGREGATION",
    "LOSS_AGGREGATIONS",
    "LossAggregation",
    "check_loss_aggregation",
    "loss_weights",
    "row_weights",
    "token_count",
    "token_weights",
]

LossAggregation = Literal["rollout-mean-token-mean", "token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]
"""The loss aggregation modes (see the module docstring)."""
LOSS_AGGREGATIONS: tuple[LossAggregation, ...] = get_args(LossAggregation)
"""Every mode, the default first."""
DEFAULT_LOSS_AGGREGATION: LossAggregation = "rollout-mean-token-mean"
"""Each rollout weighs the same (LightningRL's default)."""


def check_loss_aggregation(mode: str) -> LossAggregation:
    """``mode`` if it is a known aggregation, else a :class:`UserError` listing the valid ones."""
    for known in LOSS_AGGREGATIONS:
        if mode == known:
            return known
    raise UserError(f"unknown loss aggregation {mode!r}; valid names: {', '.join(LOSS_AGGREGATIONS)}")


def row_weights(
    rollout_ids: Sequence[str], token_counts: Sequence[int | float], mode: str = DEFAULT_LOSS_AGGREGATION
) -> list[float]:
    """Per-row weight of each counted token so that the weighted token sum is the ``mode`` loss.

    Args:
        rollout_ids: the rollout of each row (only ``rollout-mean-token-mean`` reads them).
        token_counts: counted (mask 1) response tokens of each row.
        mode: one of :data:`LOSS_AGGREGATIONS`.
    """
    check_loss_aggregation(mode)
    if len(rollout_ids) != len(token_counts):
        raise UserError(f"{len(rollout_ids)} rollout ids for {len(token_counts)} token counts")
    live = [n for n in token_counts if n > 0]
    if not live:
        return [0.0] * len(token_counts)
    if mode == "token-mean":
        total = sum(live)
        return [1.0 / total if n > 0 else 0.0 for n in token_counts]
    if mode == "seq-mean-token-mean":
        return [1.0 / (len(live) * n) if n > 0 else 0.0 for n in token_counts]
    if mode == "seq-mean-token-sum":
        return [1.0 / len(live) if n > 0 else 0.0 for n in token_counts]
    per_rollout: dict[str, float] = {}
    for rid, n in zip(rollout_ids, token_counts, strict=True):
        if n > 0:
            per_rollout[rid] = per_rollout.get(rid, 0) + n
    return [
        1.0 / (len(per_rollout) * per_rollout[rid]) if n > 0 else 0.0
        for rid, n in zip(rollout_ids, token_counts, strict=True)
    ]


def token_count(t: Transition) -> int:
    """Response tokens of ``t`` that count in the loss (mask 1)."""
    return sum(t.response_mask) if t.response_mask is not None else len(t.response_ids)


def loss_weights(transitions: Sequence[Transition], mode: str = DEFAULT_LOSS_AGGREGATION) -> list[float]:
    """:func:`row_weights` of ``transitions`` (one weight per transition)."""
    return row_weights([t.rollout_id for t in transitions], [token_count(t) for t in transitions], mode)


def token_weights(transitions: Sequence[Transition], weights: Sequence[float]) -> list[list[float]]:
    """Per-token weights: ``weights[t]`` on each counted response token of ``t``, 0.0 on masked ones."""
    if len(weights) != len(transitions):
        raise UserError(f"{len(weights)} weights for {len(transitions)} transitions")
    out = []
    for t, w in zip(transitions, weights, strict=True):
        mask = t.response_mask if t.response_mask is not None else [1] * len(t.response_ids)
        out.append([w if m else 0.0 for m in mask])
    return out
