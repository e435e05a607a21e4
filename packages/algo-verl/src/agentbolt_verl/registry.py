"""Importing this module registers agentbolt's estimators and policy loss in verl's registries.

verl imports it in its worker processes through ``actor_rollout_ref.model.external_lib``
(``HFModelConfig.__post_init__`` calls ``import_external_libs``); the binding sets that key.
"""

from __future__ import annotations

from .advantage import REGISTERED_ESTIMATORS, register_estimators
from .losses import LOSS_MODE, register_losses

__all__ = ["LOSS_MODE", "REGISTERED_ESTIMATORS", "register_all"]


def register_all() -> dict[str, list[str]]:
    """(Re-)register everything; returns the registered names by registry."""
    return {"adv_estimators": register_estimators(), "policy_losses": register_losses()}
