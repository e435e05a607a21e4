"""The part of the store protocol about runs, their metrics, and the dashboard's read queries.

Every backend implements it (:class:`~agentbolt.store.Store` includes it); the conformance
tests are in :mod:`agentbolt.testing.run_conformance`. Each method is the one declaration of
its operation (see :mod:`agentbolt.store.operations`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Protocol

from pydantic import BeforeValidator

from .. import types as t
from .operations import operation
from .run_records import (
    RolloutSearch,
    RolloutSearchPage,
    Run,
    RunMetrics,
    RunSpec,
    RunStatus,
    StoreHealth,
    check_metric_values,
)
from .wire import Limit

__all__ = ["RunStore"]


def _metric_values(values: object) -> object:
    return check_metric_values(values) if isinstance(values, Mapping) else values  # pydantic refuses the rest


MetricValues = Annotated[Mapping[str, float], BeforeValidator(_metric_values)]
"""Metric name -> finite value (anything else raises ``SchemaError``)."""


def _with_run_id(request: Any) -> Any:
    """Name a run before it is sent or stored: a retry after a lost answer then conflicts
    instead of starting the run twice."""
    spec: RunSpec = request.spec
    if spec.run_id is not None:
        return None
    return request.model_copy(update={"spec": spec.model_copy(update={"run_id": t.new_id("run-")})})


class RunStore(Protocol):
    """Runs and their metrics; searching rollouts; the queue's health. All methods are coroutines."""

    @operation("POST /v1/runs", tag="runs", body="spec", idempotent=False, prepare=_with_run_id)
    async def start_run(self, spec: RunSpec) -> Run:
        """Record a new running run; returns it. An existing ``run_id`` raises
        :class:`~agentbolt.errors.ConflictError`.

        Args:
            spec: the run; one without ``run_id`` gets a new one.
        """
        ...

    @operation("POST /v1/runs/{run_id}/finish", tag="runs", idempotent=False)
    async def finish_run(self, run_id: str, status: RunStatus, *, error: str | None = None) -> Run:
        """Give a running run its final status. Unknown ids raise ``NotFoundError``; a run that
        already ended raises ``InvalidTransitionError``.

        Args:
            run_id: the run.
            status: the final status.
            error: why the run failed.
        """
        ...

    @operation("GET /v1/runs/{run_id}", tag="runs")
    async def get_run(self, run_id: str) -> Run:
        """One run (``NotFoundError`` if unknown).

        Args:
            run_id: the run.
        """
        ...

    @operation("GET /v1/runs", tag="runs", returns="runs")
    async def list_runs(self, *, limit: Limit = 100) -> list[Run]:
        """The newest runs first.

        Args:
            limit: most runs returned.
        """
        ...

    @operation("POST /v1/runs/{run_id}/metrics", tag="runs", idempotent=False)
    async def add_run_metrics(self, run_id: str, step: t.Int64, values: MetricValues) -> RunMetrics:
        """Record finite metric values of a step (several calls may name the same step); updates
        the run's ``steps`` and ``latest``. Non-finite or non-numeric values raise ``SchemaError``.

        Args:
            run_id: the run.
            step: the algorithm's step.
            values: metric name -> finite value.
        """
        ...

    @operation("GET /v1/runs/{run_id}/metrics", tag="runs", returns="metrics")
    async def get_run_metrics(self, run_id: str, *, after_seq: t.Int64 | None = None) -> list[RunMetrics]:
        """A run's recorded metrics in ``seq`` order; ``after_seq`` returns only newer ones.

        Args:
            run_id: the run.
            after_seq: only metrics after this ``seq``.
        """
        ...

    @operation("POST /v1/rollouts/search", tag="rollouts", body="query")
    async def search_rollouts(self, query: RolloutSearch) -> RolloutSearchPage:
        """Rollouts matching every filter of ``query``, newest first, one page, with the total.

        Args:
            query: the filters and the page.
        """
        ...

    @operation("GET /v1/store/health", tag="maintenance")
    async def store_health(self) -> StoreHealth:
        """Queue length, attempts by status, failures by kind, retries and the runners seen."""
        ...
