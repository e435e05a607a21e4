"""Ray ``worker_process_setup_hook`` of the binding (set by ``compose_verl_config``)."""

from __future__ import annotations

__all__ = ["worker_setup"]


def worker_setup() -> None:
    """Register agentbolt's policy loss, advantage sentinel and trainers in this Ray worker process.

    verl resolves ``trainer.v1.trainer_mode`` in its TaskRunner actor and the policy loss in
    its actor workers; both look names up in registries filled at import time.
    """
    from .. import registry  # noqa: F401  (policy loss, advantage sentinel)
    from . import trainer  # noqa: F401  (the agentbolt_sync / agentbolt_colocate_async trainers)
