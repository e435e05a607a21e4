"""The policy update: :class:`~.updater.PolicyUpdater` (PPO-clip / GRPO / NLL from transitions)
and its parts: options and metrics (:mod:`.config`), batching (:mod:`.batches`), the forward pass
(:mod:`.forward`), activation recomputation (:mod:`.recompute`), the loss (:mod:`.loss`) and
checkpoints (:mod:`.checkpoint`)."""

from __future__ import annotations

from agentbolt._lazy import lazy_exports

__all__ = ["PolicyUpdater", "UpdateConfig", "UpdateMetrics"]

__getattr__, __dir__ = lazy_exports(
    __name__, {"PolicyUpdater": "updater", "UpdateConfig": "config", "UpdateMetrics": "config"}
)
