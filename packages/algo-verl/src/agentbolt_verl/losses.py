"""The one policy loss agentbolt registers in verl: PPO-clip weighted by LightningRL's loss weights.

LightningRL decides each token's advantage and loss weight (:mod:`agentbolt_verl.columns`
writes them into the batch on verl's driver). verl hands a policy loss exactly one per-token
tensor besides the advantages: ``rollout_is_weights`` (``verl/workers/utils/losses.py``
``ppo_loss`` selects ``response_mask``, ``old_log_probs``, ``advantages``,
``rollout_is_weights`` and ``ref_log_prob``), so that is the column that carries the loss
weight. verl's own rollout correction, the only other writer of that column, never runs: the
binding's trainer replaces verl's advantage step, and the correction is LightningRL's (its IS
weights are already a factor of the loss weight).

:func:`compute_policy_loss_agentbolt` is verl's clipped PPO objective
(``compute_policy_loss_vanilla``: ratio clamped to exp(±20), clip ``[1-ε_low, 1+ε_high]``, dual
clip ``clip_ratio_c``) per token, times the weight, summed, and divided by verl's mini-batch row
count (``seq-mean-token-sum``): the column holds ``B · w`` for a step of ``B`` rows, so with one
mini-batch per step the loss is exactly ``Σ_tokens w · pg_loss`` (LightningRL's loss), and with
``M`` mini-batches each one's loss is ``M`` times its rows' share (unbiased for the step's loss;
agentbolt-torch recomputes the weights per mini-batch instead).

Select it with ``actor_rollout_ref.actor.policy_loss.loss_mode=agentbolt`` (the binding does).
The loss runs in verl's worker processes: they import this module through
``actor_rollout_ref.model.external_lib=agentbolt_verl.registry`` (set by the binding). Entropy
and KL terms use ``actor.loss_agg_mode``, derived from ``loss_aggregation`` (verl has no
per-rollout mode: ``rollout-mean-token-mean`` maps to its per-sequence mean there).
"""

from __future__ import annotations

from typing import Any

import torch

from agentbolt.errors import UserError

from ._verl import import_verl
from .config import LOSS_MODE

core_algos = import_verl("verl.trainer.ppo.core_algos")

__all__ = ["LOSS_MODE", "LOSS_WEIGHT_KEY", "compute_policy_loss_agentbolt", "register_losses"]

LOSS_WEIGHT_KEY = "rollout_is_weights"
"""The batch column that carries LightningRL's per-token loss weight (see the module docstring)."""


def compute_policy_loss_agentbolt(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str | None = None,
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """PPO-clip per token times LightningRL's loss weight (``rollout_is_weights``), summed per row and
    divided by the mini-batch's rows. ``loss_agg_mode`` is ignored: the weights are the aggregation."""
    if rollout_is_weights is None:
        raise UserError(
            f"policy loss {LOSS_MODE!r} needs LightningRL's loss weights in the batch column {LOSS_WEIGHT_KEY!r}: "
            "train with agentbolt-verl's trainer (trainer.v1.trainer_mode=agentbolt_sync), which writes them"
        )
    return core_algos.compute_policy_loss_vanilla(
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=response_mask,
        loss_agg_mode="seq-mean-token-sum",
        config=config,
        rollout_is_weights=rollout_is_weights,
    )


def register_losses() -> list[str]:
    """Register :data:`LOSS_MODE` in verl's ``POLICY_LOSS_REGISTRY`` (idempotent)."""
    registry = core_algos.POLICY_LOSS_REGISTRY
    existing = registry.get(LOSS_MODE)
    if (
        existing is not None
        and existing is not compute_policy_loss_agentbolt
        and getattr(existing, "__module__", None) != __name__
    ):
        raise UserError(f"verl policy loss {LOSS_MODE!r} is already registered by {existing.__module__}")
    core_algos.register_policy_loss(LOSS_MODE)(compute_policy_loss_agentbolt)
    return [LOSS_MODE]


register_losses()
