"""Layer 2: the per-rollout policy loss, registered in verl's policy-loss registry.

A batch row is one LLM call; a rollout has one or more rows. With ``token-mean`` every token
of the batch weighs the same, so a rollout with many calls (or long answers) dominates the
gradient. The per-rollout mean weighs each rollout the same: ``(1/J) Σ_j (1/N_j) Σ_{t∈j} loss_t``
over the ``J`` rollouts and their ``N_j`` trained tokens.

verl hands a policy loss only ``old_log_prob, log_prob, advantages, response_mask,
loss_agg_mode, config, rollout_is_weights`` (``verl/workers/utils/losses.py`` ``ppo_loss``), so
rollout membership cannot reach it. The weights therefore travel inside the advantages: the
rollout-level estimators of :mod:`agentbolt_verl.advantage` (``aggregation="rollout-mean-token-mean"``)
multiply each row's advantage by :func:`~agentbolt_verl.advantage.rollout_weights`, and the loss
registered here, :data:`LOSS_MODE`, is verl's clipped PPO objective
(``compute_policy_loss_vanilla``) summed per row and divided by the mini-batch's row count
(verl's ``seq-mean-token-sum``). The clipped objective is positively homogeneous in the
advantage, so this equals the per-rollout mean of the unweighted per-token losses. The weights
are core's (:func:`agentbolt.lightningrl.row_weights`, mode ``rollout-mean-token-mean``, the
:class:`~agentbolt.lightningrl.LightningRLConfig` default); verl's own modes (``token-mean``,
``seq-mean-token-mean``, ``seq-mean-token-sum``) run as verl's ``loss_agg_mode`` instead.

Select it with ``actor_rollout_ref.actor.policy_loss.loss_mode=agentbolt_rollout_mean``. The
loss runs in verl's worker processes: make them import this module
(``actor_rollout_ref.model.external_lib=agentbolt_verl.registry``; the binding sets it).
Entropy and KL terms keep ``actor.loss_agg_mode`` (``token-mean`` by default).
"""

from __future__ import annotations

from typing import Any

import torch

from agentbolt.errors import UserError

from ._verl import import_verl

core_algos = import_verl("verl.trainer.ppo.core_algos")

__all__ = ["LOSS_MODE", "compute_policy_loss_rollout_mean", "register_losses"]

LOSS_MODE = "agentbolt_rollout_mean"
"""Registered name (``actor_rollout_ref.actor.policy_loss.loss_mode``)."""


def compute_policy_loss_rollout_mean(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Clipped PPO loss over advantages pre-weighted per rollout (see the module docstring).

    ``loss_agg_mode`` is ignored for the policy-gradient term: the per-rollout weights are in
    the advantages and the rows are summed with verl's ``seq-mean-token-sum``.
    """
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
        and existing is not compute_policy_loss_rollout_mean
        and getattr(existing, "__module__", None) != __name__
    ):
        raise UserError(f"verl policy loss {LOSS_MODE!r} is already registered by {existing.__module__}")
    core_algos.register_policy_loss(LOSS_MODE)(compute_policy_loss_rollout_mean)
    return [LOSS_MODE]


register_losses()
