"""What one run of :class:`~agentbolt_torch.training.algorithm.TorchGRPO` carries from step to step
(:class:`RunState`), and the step metrics its synchronous and asynchronous schedules share
(:func:`engine_delta`, :func:`wait_shares`, :func:`mean_reward`)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from agentbolt import types as t
from agentbolt.algorithm import AlgorithmContext

__all__ = ["RunState", "engine_delta", "mean_reward", "wait_shares"]


_ENGINE_COUNTERS = (
    "prompt_tokens",
    "cached_prompt_tokens",
    "generated_tokens",
    "prefill_batches",
    "decode_steps",
    "busy_s",
)


def engine_delta(before: Any, after: Any) -> dict[str, float]:
    """What the generation engine did between two stats snapshots, as ``engine/*`` metrics."""
    return {f"engine/{name}": float(getattr(after, name) - getattr(before, name)) for name in _ENGINE_COUNTERS}


def mean_reward(rollouts: Sequence[t.Rollout]) -> float:
    values = [r.final_reward if r.final_reward is not None else 0.0 for r in rollouts]
    return statistics.fmean(values) if values else 0.0


class RunState:
    """What one run's loop carries: the context, the policy and its updater, LightningRL, the
    metrics log and the running totals of the result."""

    def __init__(self, ctx: AlgorithmContext, policy: Any, updater: Any, lrl: Any, metrics: Any) -> None:
        self.ctx = ctx
        self.policy = policy
        self.updater = updater
        self.lrl = lrl
        self.metrics = metrics
        self.history: list[dict[str, float]] = []
        self.step_times: list[float] = []
        self.rewards: list[float] = []
        self.stale_calls = 0
        self.untrained_rollouts = 0

    def log_step(self, step: int, values: Mapping[str, float]) -> None:
        """Record a step's finite numbers in the history, ``metrics.jsonl`` and the store."""
        values = {k: v for k, v in values.items() if isinstance(v, int | float) and math.isfinite(v)}
        self.history.append({"step": step, **values})
        self.metrics.log(values, step=step)
        self.ctx.log_metrics(step, values)


def wait_shares(values: Mapping[str, float], elapsed: float, *, rollouts_wait_s: float) -> dict[str, float]:
    """The share of a step's wall time each side spent waiting for the other: the trainer for
    rollouts (``time/trainer_wait_s``), the rollouts for the trainer (no training rollout could
    run: the update of a synchronous step, the bound or a swap in an asynchronous one)."""
    if elapsed <= 0:
        return {}
    return {
        "time/rollouts_wait_s": rollouts_wait_s,
        "time/trainer_wait_share": values.get("time/trainer_wait_s", 0.0) / elapsed,
        "time/rollouts_wait_share": rollouts_wait_s / elapsed,
    }
