"""The binding's verl trainer: ``PPOTrainerSync`` plus :class:`~.coordinator.AgentboltTrainerMixin`.

Registered with verl's ``register_trainer`` as ``agentbolt_sync``; select it with
``trainer.v1.trainer_mode=agentbolt_sync`` (``compose_verl_config`` does). verl looks the
name up inside its TaskRunner actor, so that process must import this module: the binding
sets Ray's ``worker_process_setup_hook`` to :func:`agentbolt_verl.binding.worker_hooks.worker_setup`.
"""

from __future__ import annotations

from .._verl import import_verl
from ..config import TRAINER_MODE
from .coordinator import AgentboltTrainerMixin
from .rollouts import MetricsSink

import_verl("verl.trainer.ppo.v1")

from verl.trainer.ppo.v1 import PPOTrainerSync, register_trainer  # noqa: E402

__all__ = ["AgentboltPPOTrainer"]


@register_trainer(TRAINER_MODE)
class AgentboltPPOTrainer(AgentboltTrainerMixin, PPOTrainerSync):
    """verl's synchronous V1 trainer, with the gateway following the replicas' weight syncs,
    rollout membership for agentbolt's estimators, and the agent loops' counts in the metrics."""

    def _agentbolt_make_sink(self) -> MetricsSink | None:
        from .ray_sink import RayMetricsSink

        return RayMetricsSink()
