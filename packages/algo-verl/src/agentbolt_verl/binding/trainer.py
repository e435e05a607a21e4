"""The binding's verl trainers: verl's V1 trainers plus :class:`~.coordinator.AgentboltTrainerMixin`.

- ``agentbolt_sync``: ``PPOTrainerSync`` (generation, then the update, replicas asleep while it runs);
- ``agentbolt_colocate_async``: ``PPOTrainerColocateAsync`` (``agentbolt.async``: generation for
  the next batches runs ahead by ``num_warmup_batches``; partial rollouts span weight updates).

Both are registered with verl's ``register_trainer``; ``compose_verl_config`` sets
``trainer.v1.trainer_mode``. verl looks the name up inside its TaskRunner actor, so that process
must import this module: the binding sets Ray's ``worker_process_setup_hook`` to
:func:`agentbolt_verl.binding.worker_hooks.worker_setup`.

This module is the only one that touches verl's TransferQueue (``tq.kv_batch_get`` /
``kv_batch_put``, the way verl's own ``_compute_advantage`` does); it runs only inside verl's
processes with ``transferqueue`` installed, and has not run on a GPU yet (see the package README).
"""

from __future__ import annotations

from typing import Any

from .._verl import import_verl
from ..columns import EXTRA_KEY, VerlColumns
from ..config import ASYNC_TRAINER_MODE, TRAINER_MODE
from ..losses import LOSS_WEIGHT_KEY
from .coordinator import AgentboltTrainerMixin, BatchFields
from .rollouts import MetricsSink

import_verl("verl.trainer.ppo.v1")

import transfer_queue as tq  # noqa: E402  (verl[verl-core]; imported by verl's V1 trainer too)
from tensordict import TensorDict  # noqa: E402
from verl.trainer.ppo.v1 import PPOTrainerSync, register_trainer  # noqa: E402
from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync  # noqa: E402
from verl.workers.utils.padding import response_to_nested  # noqa: E402

__all__ = ["AgentboltAsyncPPOTrainer", "AgentboltPPOTrainer"]

_READ = ["prompts", "responses", "response_mask", "rollout_log_probs", "old_log_probs", "extra_fields"]


class _TransferQueueIO(AgentboltTrainerMixin):
    """The mixin's batch I/O over verl's TransferQueue, as verl's ``_compute_advantage`` does it."""

    def _agentbolt_make_sink(self) -> MetricsSink | None:
        from .ray_sink import RayMetricsSink

        return RayMetricsSink()

    def _agentbolt_read_batch(self, batch: Any) -> BatchFields:
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=_READ)
        padding = [bool(tag.get("is_padding", False)) for tag in batch.tags]
        extra_fields = data.pop("extra_fields").tolist()
        prompts = [row.tolist() for row in data["prompts"].unbind()]
        responses = [row.tolist() for row in data["responses"].unbind()]
        padded = data.select(*[k for k in ("response_mask", "rollout_log_probs", "old_log_probs") if k in data])
        padded = padded.to_padded_tensor()
        return BatchFields(
            extras=[
                None if pad else dict(extra or {}).get(EXTRA_KEY)
                for pad, extra in zip(padding, extra_fields, strict=True)
            ],
            prompts=prompts,
            responses=responses,
            response_mask=padded["response_mask"],
            rollout_log_probs=padded.get("rollout_log_probs", None),
            old_log_probs=padded.get("old_log_probs", None),
        )

    def _agentbolt_write_columns(self, batch: Any, columns: VerlColumns) -> None:
        nested_mask = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=["response_mask"]
        )["response_mask"]
        output = {
            "advantages": columns.advantages,
            "returns": columns.advantages,
            LOSS_WEIGHT_KEY: columns.loss_weight,
            "response_mask": columns.response_mask,
        }
        nested = {name: response_to_nested(value, nested_mask) for name, value in output.items()}
        tq.kv_batch_put(
            keys=batch.keys, partition_id=batch.partition_id, fields=TensorDict(nested, batch_size=len(batch))
        )


@register_trainer(TRAINER_MODE)
class AgentboltPPOTrainer(_TransferQueueIO, PPOTrainerSync):
    """verl's synchronous V1 trainer, with the gateway following the replicas' weight syncs,
    LightningRL's advantage step, and the agent loops' counts in the metrics."""


@register_trainer(ASYNC_TRAINER_MODE)
class AgentboltAsyncPPOTrainer(_TransferQueueIO, PPOTrainerColocateAsync):
    """verl's ``colocate_async`` V1 trainer with the same additions (``agentbolt.async``)."""
