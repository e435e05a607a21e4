"""Records a trainer's run in the store: started before the algorithm, finished after it with
``succeeded``, ``failed`` (with the error) or ``cancelled``, once its metrics are written."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, TypeVar

from ..store.base import Store
from ..store.run_records import Run, RunSpec, RunStatus

if TYPE_CHECKING:  # the recorder only calls the algorithm's and context's methods
    from ..algorithm import Algorithm, AlgorithmContext

__all__ = ["RunRecorder"]

log = logging.getLogger(__name__)

R = TypeVar("R")


class RunRecorder:
    """Start the run of ``ctx.run_id`` in ``store`` and finish it around the algorithm."""

    def __init__(
        self,
        store: Store,
        ctx: AlgorithmContext,
        algorithm: Algorithm,
        *,
        name: str | None = None,
        extra_config: dict[str, Any] | None = None,
    ) -> None:
        self.store = store
        self.extra_config = dict(extra_config or {})
        self.ctx = ctx
        self.algorithm = algorithm
        self.name = name
        self.run: Run | None = None

    async def start(self) -> Run:
        """Record the running run (id ``ctx.run_id``)."""
        spec = RunSpec(
            run_id=self.ctx.run_id,
            name=self.name,
            algorithm=self.algorithm.name,
            model=self.algorithm.run_model(),
            config=self._config(),
        )
        self.run = await self.store.start_run(spec)
        log.info("run %s started (%s)", self.run.run_id, self.algorithm.name)
        return self.run

    def _config(self) -> dict[str, Any]:
        config = {**self.algorithm.run_config(), **self.extra_config}
        if not self.ctx.policies.is_shared:  # the dashboard draws per-policy curves from it
            config = {**config, "policies": self.ctx.policies.as_record()}
        return config

    async def watch(self, work: Awaitable[R]) -> R:
        """Await the algorithm; then wait for its metrics and record how the run ended."""
        try:
            result = await work
        except asyncio.CancelledError:
            await self._finish(RunStatus.CANCELLED, "cancelled")
            raise
        except BaseException as exc:
            await self._finish(RunStatus.FAILED, f"{type(exc).__name__}: {exc}")
            raise
        await self._finish(RunStatus.SUCCEEDED, None)
        return result

    async def _finish(self, status: RunStatus, error: str | None) -> None:
        try:
            await self.ctx.flush_metrics()
            self.run = await self.store.finish_run(self.ctx.run_id, status, error=error)
        except Exception as exc:  # never hide the algorithm's own outcome behind this
            log.warning("could not record the end of run %s: %s", self.ctx.run_id, exc)
