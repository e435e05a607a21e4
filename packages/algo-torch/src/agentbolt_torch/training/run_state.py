"""What one run of :class:`~agentbolt_torch.training.algorithm.TorchGRPO` carries from step to step
(:class:`RunState`), the public step interface a schedule drives (:class:`TrainingSteps`, its
:class:`StepPlan`), and the step metrics the synchronous and asynchronous schedules share
(:func:`engine_delta`, :func:`wait_shares`, :func:`mean_reward`).

The asynchronous schedule (:mod:`.asynchronous`) sits below the algorithm: it is given a
:class:`TrainingSteps` and never imports :mod:`.algorithm` (no back-reference, no private members).
"""

from __future__ import annotations

import contextlib
import math
import statistics
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from agentbolt import types as t
from agentbolt.algorithm import AlgorithmContext

__all__ = ["RunState", "StepPlan", "TrainingSteps", "UpdateFn", "engine_delta", "mean_reward", "wait_shares"]


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

    def __init__(
        self, ctx: AlgorithmContext, policy: Any, updater: Any, lrl: Any, metrics: Any, *, generator: Any
    ) -> None:
        self.ctx = ctx
        self.policy = policy
        self.generator = generator
        """What serves the policy (a :class:`~agentbolt_torch.generation.Generator`): its ``stats``
        and, asynchronously, ``swap_weights``."""
        self.stream: Any = None
        """The asynchronous schedule's :class:`~.asynchronous.GroupStream` while it runs."""
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


UpdateFn = Callable[[list[Any]], Awaitable[tuple[Any, dict[str, float]]]]
"""A step's update: training rows -> the update's result and extra metrics."""


@dataclass(frozen=True)
class StepPlan:
    """What a schedule needs to know of an algorithm's steps."""

    steps: int
    batch_size: int
    group_size: int
    seed: int
    """Seed of the task order (``agentbolt.algorithm.batches``)."""
    max_staleness: int | None
    """The asynchronous bound (``None``: synchronous)."""
    tag: str
    """Rollout-id tag of a training step (``step3``)."""
    label: str
    """What the progress line calls a training step."""
    swap: Literal["inplace", "drain"]
    """How new weights reach the serving copy after an asynchronous update."""
    evaluation_sampling_differs: bool
    """Held-out sampling differs from training's (the gateway forces one set, so the training
    rollouts in flight finish before an evaluation)."""


class TrainingSteps(Protocol):
    """The public step interface of a training algorithm, what a schedule drives
    (:func:`~.asynchronous.train_async`; :class:`~.algorithm.TorchGRPO` implements it)."""

    @property
    def plan(self) -> StepPlan:
        """The steps' sizes, order and bound."""
        ...

    async def publish_training(self, run: RunState) -> None:
        """Publish the training resources (gateway URL, sampling, the policy's current version)."""
        ...

    async def train_rollouts(
        self,
        run: RunState,
        step: int,
        rollouts: Sequence[t.Rollout],
        *,
        update: UpdateFn,
        timing: Mapping[str, float],
    ) -> dict[str, float] | None:
        """Train a step on finished ``rollouts`` with ``update``; the step's metrics for the caller
        to complete and log, or ``None`` when the update was skipped (logged)."""
        ...

    async def after_step(
        self,
        run: RunState,
        step: int,
        val: Sequence[t.Task],
        *,
        around_eval: Callable[[], contextlib.AbstractAsyncContextManager[Any]] | None = None,
    ) -> None:
        """Evaluation and checkpoint on their schedules after a step."""
        ...
