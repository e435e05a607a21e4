"""Importing this module registers agentbolt's policy loss (and its advantage sentinel) in verl.

verl imports it in its worker processes through ``actor_rollout_ref.model.external_lib``
(``HFModelConfig.__post_init__`` calls ``import_external_libs``); the binding sets that key.

There is no agentbolt advantage estimator in verl: LightningRL computes the advantages in the
binding trainer's advantage step (:mod:`agentbolt_verl.columns`). ``algorithm.adv_estimator`` is
set to :data:`ADVANTAGE_SENTINEL`, registered here as an estimator that refuses to run, so a
config that reaches verl's own advantage step (another trainer mode) fails with a message
instead of training on another signal.
"""

from __future__ import annotations

from typing import Any

from agentbolt.errors import UserError

from ._verl import import_verl
from .config import ADVANTAGE_SENTINEL
from .losses import LOSS_MODE, register_losses

core_algos = import_verl("verl.trainer.ppo.core_algos")

__all__ = ["ADVANTAGE_SENTINEL", "LOSS_MODE", "register_all"]


def _lightningrl_computes_advantages(*args: Any, **kwargs: Any) -> Any:
    raise UserError(
        f"algorithm.adv_estimator={ADVANTAGE_SENTINEL!r}: advantages are LightningRL's, computed by agentbolt-verl's "
        "trainer (trainer.v1.trainer_mode=agentbolt_sync or agentbolt_colocate_async), not by a verl estimator"
    )


def register_all() -> dict[str, list[str]]:
    """(Re-)register everything; returns the registered names by registry."""
    registry = core_algos.ADV_ESTIMATOR_REGISTRY
    existing = registry.get(ADVANTAGE_SENTINEL)
    if existing is not None and getattr(existing, "__module__", None) != __name__:
        raise UserError(
            f"verl advantage estimator {ADVANTAGE_SENTINEL!r} is already registered by {existing.__module__}"
        )
    registry[ADVANTAGE_SENTINEL] = _lightningrl_computes_advantages
    return {"adv_estimators": [ADVANTAGE_SENTINEL], "policy_losses": register_losses()}


register_all()
