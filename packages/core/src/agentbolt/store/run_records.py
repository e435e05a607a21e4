"""Runs: one training or evaluation job, its configuration and its metrics per step.

``Trainer.fit`` / ``Trainer.dev`` start a run in the store and finish it; rollouts the
algorithm enqueues carry its ``run_id`` (and the step); ``AlgorithmContext.log_metrics`` records
each step's metrics. The dashboard and ``agentbolt runs`` read them back::

    run = await store.start_run(RunSpec(name="gsm8k", algorithm="torch-grpo", model="smollm2"))
    await store.add_run_metrics(run.run_id, 1, {"train/reward": 0.25})
    await store.finish_run(run.run_id, RunStatus.SUCCEEDED)

This module also holds the read models the dashboard queries every backend with
(:class:`RolloutSearch`, :class:`StoreHealth`).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator

from .. import types as t
from ..errors import SchemaError

__all__ = [
    "RolloutSearch",
    "RolloutSearchPage",
    "Run",
    "RunMetrics",
    "RunSpec",
    "RunStatus",
    "RunnerSeen",
    "StoreHealth",
    "check_metric_values",
    "finite_metrics",
]

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class RunStatus(enum.StrEnum):
    """Where a run is."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_final(self) -> bool:
        """True for every status but ``running``."""
        return self is not RunStatus.RUNNING


class RunSpec(BaseModel):
    """What a caller gives :meth:`~agentbolt.store.Store.start_run`."""

    model_config = _FROZEN

    run_id: str | None = None
    """Caller-supplied id (unique); generated when omitted."""
    name: str | None = None
    """Human-readable name."""
    algorithm: str
    """Algorithm name (``torch-grpo``, ``evaluate``, ``verl``...)."""
    model: str | None = None
    """The policy model, when the algorithm names one."""
    config: dict[str, JsonValue] = Field(default_factory=dict)
    """The algorithm's settings (JSON)."""


class Run(BaseModel):
    """A training or evaluation run as stored."""

    model_config = _FROZEN

    run_id: str
    """Unique id (rollout ids of the run start with it)."""
    name: str | None = None
    """Human-readable name."""
    algorithm: str
    """Algorithm name."""
    model: str | None = None
    """The policy model."""
    config: dict[str, JsonValue] = Field(default_factory=dict)
    """The algorithm's settings."""
    status: RunStatus = RunStatus.RUNNING
    """Current status."""
    error: str | None = None
    """Why a failed run failed."""
    started_at: float
    """Start (Unix seconds)."""
    ended_at: float | None = None
    """End, once final."""
    steps: int = 0
    """Highest step with recorded metrics."""
    latest: dict[str, float] = Field(default_factory=dict)
    """The latest value of every metric recorded."""


class RunMetrics(BaseModel):
    """Metrics recorded at one step (one :meth:`~agentbolt.store.Store.add_run_metrics` call)."""

    model_config = _FROZEN

    run_id: str
    """The run."""
    seq: int
    """Store-assigned, increasing within the run (poll with ``after_seq``)."""
    step: int
    """The algorithm's step."""
    time: float
    """When it was recorded (Unix seconds)."""
    values: dict[str, float]
    """Metric name -> finite value."""


def finite_metrics(metrics: Mapping[str, object]) -> dict[str, float]:
    """The finite numbers among ``metrics``, as floats (strings, bools, NaN and infinities left
    out): what an algorithm records of its step metrics."""
    return {
        k: float(v)
        for k, v in metrics.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    }


def check_metric_values(values: Mapping[str, float]) -> dict[str, float]:
    """Finite float metrics only; raises :class:`~agentbolt.errors.SchemaError` otherwise."""
    out: dict[str, float] = {}
    for key, value in values.items():
        if not isinstance(key, str) or not key:
            raise SchemaError(f"metric names must be non-empty strings, got {key!r}")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise SchemaError(f"metric {key!r} must be a number, got {type(value).__name__}")
        try:
            number = float(value)
        except OverflowError:  # an int beyond the float range
            raise SchemaError(f"metric {key!r} is beyond the float range; only finite values are recorded") from None
        if not math.isfinite(number):
            raise SchemaError(f"metric {key!r} is {value}; only finite values are recorded")
        out[key] = number
    return out


class RolloutSearch(BaseModel):
    """Filters of :meth:`~agentbolt.store.Store.search_rollouts` (all optional, combined with AND)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    run_id: str | None = None
    """Only rollouts of this run."""
    step: t.Int64 | None = None
    """Only rollouts of this step."""
    status: list[t.RolloutStatus] | None = None
    """Any of these statuses."""
    mode: t.RolloutMode | None = None
    """Only ``train`` or ``val``."""
    reward_min: float | None = None
    """Final reward at least this (rollouts without a reward are left out)."""
    reward_max: float | None = None
    """Final reward at most this."""
    text: str | None = None
    """Case-insensitive substring of the task id or the input (JSON)."""
    failure_kind: t.ErrorKind | None = None
    """Only rollouts whose error has this kind."""
    limit: int = Field(default=50, ge=1, le=1000)
    """Page size."""
    offset: int = Field(default=0, ge=0, le=t.INT64_MAX)
    """Rows to skip (newest first)."""

    @field_validator("text")
    @classmethod
    def _blank_is_none(cls, value: str | None) -> str | None:
        return value or None


class RolloutSearchPage(BaseModel):
    """One page of :meth:`~agentbolt.store.Store.search_rollouts`, newest first."""

    items: list[t.Rollout]
    """The rollouts of this page."""
    total: int
    """How many rollouts match in all."""


class RunnerSeen(BaseModel):
    """A worker that claimed rollouts."""

    worker_id: str
    """The runner's worker id."""
    attempts: int
    """Attempts it started."""
    running: int
    """Of which still running."""
    last_seen: float
    """Latest attempt start or heartbeat (Unix seconds)."""


class StoreHealth(BaseModel):
    """The state of the queue and the runners (:meth:`~agentbolt.store.Store.store_health`)."""

    rollouts: dict[t.RolloutStatus, int]
    """Rollouts per status (``queued`` is the queue length)."""
    attempts: dict[t.AttemptStatus, int]
    """Attempts per status."""
    expired_leases: int
    """Running attempts whose lease has expired (the sweeper will mark them lost)."""
    failures: dict[str, int]
    """Failed / cancelled rollouts by error kind."""
    retried_rollouts: int
    """Rollouts that needed more than one attempt."""
    retries: int
    """Attempts beyond the first, over all rollouts."""
    runners: list[RunnerSeen]
    """Workers that started attempts, most recently seen first."""
