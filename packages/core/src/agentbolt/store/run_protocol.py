"""The part of the store protocol about runs, their metrics, and the dashboard's read queries.

Every backend implements it (:class:`~agentbolt.store.Store` includes it); the conformance
tests are in :mod:`agentbolt.testing.run_conformance`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from .run_records import RolloutSearch, RolloutSearchPage, Run, RunMetrics, RunSpec, RunStatus, StoreHealth

__all__ = ["RunStore"]


class RunStore(Protocol):
    """Runs and their metrics; searching rollouts; the queue's health. All methods are coroutines."""

    async def start_run(self, spec: RunSpec) -> Run:
        """Record a new running run; returns it. An existing ``run_id`` raises
        :class:`~agentbolt.errors.ConflictError`."""
        ...

    async def finish_run(self, run_id: str, status: RunStatus, *, error: str | None = None) -> Run:
        """Give a running run its final status. Unknown ids raise ``NotFoundError``; a run that
        already ended raises ``InvalidTransitionError``."""
        ...

    async def get_run(self, run_id: str) -> Run:
        """One run (``NotFoundError`` if unknown)."""
        ...

    async def list_runs(self, *, limit: int = 100) -> list[Run]:
        """The newest runs first."""
        ...

    async def add_run_metrics(self, run_id: str, step: int, values: Mapping[str, float]) -> RunMetrics:
        """Record finite metric values of a step (several calls may name the same step); updates
        the run's ``steps`` and ``latest``. Non-finite or non-numeric values raise ``SchemaError``."""
        ...

    async def get_run_metrics(self, run_id: str, *, after_seq: int | None = None) -> list[RunMetrics]:
        """A run's recorded metrics in ``seq`` order; ``after_seq`` returns only newer ones."""
        ...

    async def search_rollouts(self, query: RolloutSearch) -> RolloutSearchPage:
        """Rollouts matching every filter of ``query``, newest first, one page, with the total."""
        ...

    async def store_health(self) -> StoreHealth:
        """Queue length, attempts by status, failures by kind, retries and the runners seen."""
        ...
