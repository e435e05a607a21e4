"""Runners: processes that lease rollouts from the store and run the agent on them.

- :mod:`~agentbolt.runners.runner` — one runner (:class:`Runner`, :class:`RunnerConfig`): M
  concurrent rollouts on one event loop, heartbeats, timeouts, graceful drain;
- :mod:`~agentbolt.runners.workers` — the threads that run synchronous agents;
- :mod:`~agentbolt.runners.pool` — N runner processes on this machine (:class:`RunnerPool`);
- :mod:`~agentbolt.runners.ray` — runner workers as Ray actors (:class:`RayRunnerPool`; needs
  ``agentbolt[ray]``).

Names are imported on first use, so ``import agentbolt.runners`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from .pool import RunnerPool
    from .ray import RayRunnerPool, RayWorkerOptions
    from .runner import AgentLike, Runner, RunnerConfig, RunnerStats

__all__ = ["AgentLike", "RayRunnerPool", "RayWorkerOptions", "Runner", "RunnerConfig", "RunnerPool", "RunnerStats"]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "AgentLike": "runner",
        "Runner": "runner",
        "RunnerConfig": "runner",
        "RunnerStats": "runner",
        "RunnerPool": "pool",
        "RayRunnerPool": "ray",
        "RayWorkerOptions": "ray",
    },
)
