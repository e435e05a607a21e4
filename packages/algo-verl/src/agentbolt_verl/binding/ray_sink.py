"""A :class:`~.rollouts.MetricsSink` shared by every process of a verl run (a named Ray actor).

The agent loops (in verl's ``AgentLoopWorker`` actors) add their per-rollout counts; the
trainer drains them into each step's metrics.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["SINK_ACTOR_NAME", "RayMetricsSink"]

SINK_ACTOR_NAME = "agentbolt-verl-metrics"

_actor_cls: Any = None


def _sink_actor() -> Any:
    global _actor_cls
    import ray

    if _actor_cls is None:

        class _Sink:
            def __init__(self) -> None:
                self.counts: dict[str, float] = {}

            def add(self, counts: dict[str, float]) -> None:
                for key, value in counts.items():
                    self.counts[key] = self.counts.get(key, 0.0) + value

            def drain(self) -> dict[str, float]:
                out, self.counts = self.counts, {}
                return out

        _actor_cls = ray.remote(num_cpus=0)(_Sink)
    return _actor_cls.options(name=SINK_ACTOR_NAME, get_if_exists=True).remote()


class RayMetricsSink:
    """Proxy to the named sink actor (created by the first process that asks for it)."""

    def __init__(self) -> None:
        self._actor = _sink_actor()

    def add(self, counts: Mapping[str, float]) -> None:
        self._actor.add.remote({k: float(v) for k, v in counts.items()})  # fire and forget

    def drain(self) -> dict[str, float]:
        import ray

        return ray.get(self._actor.drain.remote())
