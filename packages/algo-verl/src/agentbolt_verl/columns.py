"""The advantage step of a verl batch, by LightningRL: ``advantages`` and the loss-weight column.

verl-free (torch only), so it runs and is tested on CPU; the binding's trainer
(:mod:`agentbolt_verl.binding.trainer`) reads the batch's fields from verl's TransferQueue, calls
:func:`verl_columns` and writes the result back, in place of verl's own advantage step.

Each row of the batch is one of LightningRL's transitions, produced per rollout in the agent
loop (:meth:`agentbolt.lightningrl.LightningRL.collect`: credit, merging, exclusions) and
described by :data:`EXTRA_KEY` in the row's ``extra_fields``: rollout, group, call index, agent,
credit (``reward``) and the verl weight version that sampled it. verl overwrites every row's
``reward_score`` with the last row's, so the credit travels there, not in ``rm_scores``.
:func:`verl_columns` rebuilds the transitions and hands them to
:meth:`~agentbolt.lightningrl.LightningRL.to_rows` (staleness bound, advantages, loss weights),
applies :func:`~agentbolt.lightningrl.rollout_correction` (behaviour = ``rollout_log_probs``,
proximal = verl's recomputed ``old_log_probs``) when configured, and lays the result out as
verl's (B, R) tensors. Nothing here decides a training signal: LightningRL does.

A row whose credit is not a reward (:mod:`agentbolt.reward_validation`: not a number, not finite,
beyond ``1e15``) puts its rollout in quarantine: every row of that rollout is left out (mask 0),
``agentbolt/lightningrl/quarantined/<reason>`` counts it, and the step goes on with the others.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from agentbolt.errors import SchemaError
from agentbolt.lightningrl import (
    LightningRL,
    LightningRLBatch,
    LightningRLConfig,
    Quarantined,
    TrainingRow,
    rollout_correction,
    token_loss_weights,
)
from agentbolt.reward_validation import RewardRefused, reward_number
from agentbolt.types import Transition

__all__ = ["EXTRA_KEY", "VerlColumns", "row_extra", "verl_columns"]

EXTRA_KEY = "agentbolt"
"""Key of a row's LightningRL description in verl's ``extra_fields``."""


def row_extra(transition: Transition, weights_version: int | None) -> dict[str, Any]:
    """What a row carries in ``extra_fields[EXTRA_KEY]`` (written by the agent loop)."""
    return {
        "rollout_id": transition.rollout_id,
        "group_id": transition.group_id,
        "index": transition.index,
        "agent_name": transition.agent_name,
        "reward": transition.reward,
        "policy_version": weights_version,
        "resources_version": transition.policy_version,
        "span_id": transition.span_id,
        "merged_indices": transition.metadata.get("merged_indices"),
    }


@dataclass
class VerlColumns:
    """What :func:`verl_columns` returns: verl's (B, R) columns and the step's metrics."""

    advantages: torch.Tensor
    """LightningRL's advantage on each trained token, 0 elsewhere (float32)."""
    loss_weight: torch.Tensor
    """``B`` times LightningRL's per-token loss weight (aggregation weight times IS weight), 0 on untrained tokens
    (float32; the registered loss divides by the mini-batch's rows)."""
    response_mask: torch.Tensor
    """The trained tokens: the input mask minus rows LightningRL left out (stale, no advantage) and
    tokens rejection masked (int64)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """``agentbolt/lightningrl/*`` (the report: staleness, exclusions, advantages) and
    ``agentbolt/correction/*`` (IS weights, rejection)."""
    batch: LightningRLBatch | None = None
    """LightningRL's rows for the batch."""


def _transition(
    i: int,
    extra: Mapping[str, Any],
    prompt: list[int],
    response: list[int],
    mask: list[int],
    logprobs: list[float] | None,
) -> Transition:
    for key in ("rollout_id", "index", "reward"):
        if key not in extra:
            raise SchemaError(
                f"batch row {i}: extra_fields[{EXTRA_KEY!r}] lacks {key!r} (rows must come from agentbolt's agent loop)"
            )
    merged = extra.get("merged_indices")
    return Transition(
        rollout_id=str(extra["rollout_id"]),
        group_id=extra.get("group_id"),
        index=int(extra["index"]),
        agent_name=extra.get("agent_name"),
        prompt_ids=prompt,
        response_ids=response,
        response_mask=mask,
        response_logprobs=logprobs,
        reward=extra["reward"],
        policy_version=extra.get("policy_version"),
        span_id=extra.get("span_id"),
        metadata={"merged_indices": list(merged)} if merged else {},
    )


def verl_columns(
    extras: Sequence[Mapping[str, Any] | None],
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    response_mask: torch.Tensor,
    lightningrl: LightningRLConfig,
    *,
    trained_version: int | None,
    rollout_log_probs: torch.Tensor | None = None,
    old_log_probs: torch.Tensor | None = None,
) -> VerlColumns:
    """LightningRL's advantages and loss weights for a verl batch (see the module docstring).

    Args:
        extras: each row's ``extra_fields[EXTRA_KEY]``; ``None`` for verl's padding rows.
        prompts, responses: each row's prompt and response ids (unpadded).
        response_mask: (B, R) right-padded response masks.
        lightningrl: the config (its ``allow_empty`` is forced on: an empty step trains nothing).
        trained_version: the verl weight version being trained (``global_steps - 1``), from which
            ``max_staleness`` is measured.
        rollout_log_probs: (B, R) sampling logprobs (needed with correction).
        old_log_probs: (B, R) verl's recomputed logprobs (needed with correction).
    """
    b, width = response_mask.shape
    if not len(extras) == len(prompts) == len(responses) == b:
        raise SchemaError(f"{len(extras)} extras, {len(prompts)} prompts, {len(responses)} responses for {b} rows")
    masks = response_mask.to(torch.int64).tolist()
    behaviour = rollout_log_probs.to(torch.float64).tolist() if rollout_log_probs is not None else None
    where: dict[tuple[str, int], int] = {}
    transitions = []
    quarantined: dict[str, Quarantined] = {}
    for i, extra in enumerate(extras):
        if extra is None:
            continue
        try:
            reward_number(extra.get("reward"), f"credit of batch row {i}")
        except RewardRefused as exc:
            rollout_id = str(extra.get("rollout_id"))
            quarantined.setdefault(
                rollout_id,
                Quarantined(
                    rollout_id=rollout_id,
                    group_id=extra.get("group_id") if isinstance(extra.get("group_id"), str) else None,
                    reason=exc.reason,
                    detail=str(exc),
                    stage="to_rows",
                ),
            )
    for i, extra in enumerate(extras):
        if extra is None or str(extra.get("rollout_id")) in quarantined:
            continue
        n = len(responses[i])
        t = _transition(
            i,
            extra,
            list(prompts[i]),
            list(responses[i]),
            masks[i][:n],
            behaviour[i][:n] if behaviour is not None else None,
        )
        if (t.rollout_id, t.index) in where:
            raise SchemaError(
                f"rows {where[(t.rollout_id, t.index)]} and {i} are both call {t.index} of {t.rollout_id!r}"
            )
        where[(t.rollout_id, t.index)] = i
        transitions.append(t)

    lrl = LightningRL(lightningrl.replace(allow_empty=True))
    batch = lrl.to_rows(transitions, policy_version=trained_version, quarantined=list(quarantined.values()))
    rows: list[TrainingRow] = batch.rows
    positions = [where[(r.rollout_id, r.index)] for r in rows]
    row_masks = [r.response_mask for r in rows]
    is_weights = None
    metrics = {f"agentbolt/{k}": v for k, v in batch.report.metrics("lightningrl/").items()}
    correction = lightningrl.correction
    if correction is not None and rows:
        if old_log_probs is None:
            raise SchemaError("off-policy correction needs verl's old_log_probs (the recomputed proximal logprobs)")
        behaviour = [r.behaviour_logprobs for r in rows if r.behaviour_logprobs is not None]
        if len(behaviour) < len(rows):  # LightningRL leaves such calls out (no_logprobs) when correcting
            raise SchemaError(f"{len(rows) - len(behaviour)} rows have no behaviour (sampling) logprobs to correct")
        proximal = old_log_probs.to(torch.float64).tolist()
        result = rollout_correction(
            behaviour,
            [proximal[p][: len(r.response_ids)] for p, r in zip(positions, rows, strict=True)],
            row_masks,
            correction,
        )
        row_masks, is_weights = result.masks, result.weights
        metrics.update({f"agentbolt/correction/{k}": v for k, v in result.stats.items()})
    weights = token_loss_weights(
        [r.rollout_id for r in rows], row_masks, lightningrl.loss_aggregation, is_weights=is_weights
    )

    advantages = torch.zeros((b, width), dtype=torch.float32)
    loss_weight = torch.zeros((b, width), dtype=torch.float32)
    new_mask = torch.zeros((b, width), dtype=torch.int64)
    for p, r, m, w in zip(positions, rows, row_masks, weights, strict=True):
        n = len(m)
        mask_row = torch.tensor(m, dtype=torch.int64)
        new_mask[p, :n] = mask_row
        advantages[p, :n] = r.advantage * mask_row.to(torch.float32)
        loss_weight[p, :n] = torch.tensor(w, dtype=torch.float64).mul(b).to(torch.float32)
    return VerlColumns(
        advantages=advantages, loss_weight=loss_weight, response_mask=new_mask, metrics=metrics, batch=batch
    )
