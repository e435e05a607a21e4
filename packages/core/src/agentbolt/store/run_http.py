"""Runs, metrics, searches and health for :class:`~agentbolt.store.http.HttpStore` (routes in
:mod:`agentbolt.store.server.run_routes`, bodies in :mod:`agentbolt.store.run_wire`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote

from pydantic import BaseModel

from .. import types as t
from .run_common import check_after_seq, check_list_limit, check_step
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
from .run_wire import FinishRunRequest, RunMetricsRequest, RunMetricsResponse, RunsResponse

__all__ = ["HttpRunsMixin"]

M = TypeVar("M", bound=BaseModel)


def _path(run_id: str) -> str:
    return f"/v1/runs/{quote(run_id, safe='')}"


class HttpRunsMixin:
    """Mixed into ``HttpStore``; each method is one HTTP call."""

    if TYPE_CHECKING:  # HttpStore's, for the type checker only

        async def _post(self, path: str, body: BaseModel, answer: type[M], **kwargs: Any) -> M: ...

        async def _get(self, path: str, answer: type[M], params: Any = None) -> M: ...

    async def start_run(self, spec: RunSpec) -> Run:
        if spec.run_id is None:  # chosen here: a retry after a lost answer then conflicts instead of duplicating
            spec = spec.model_copy(update={"run_id": t.new_id("run-")})
        return await self._post("/v1/runs", spec, Run, idempotent=False)

    async def finish_run(self, run_id: str, status: RunStatus, *, error: str | None = None) -> Run:

        body = FinishRunRequest(status=status, error=error)
        return await self._post(f"{_path(run_id)}/finish", body, Run, idempotent=False)

    async def get_run(self, run_id: str) -> Run:
        return await self._get(_path(run_id), Run)

    async def list_runs(self, *, limit: int = 100) -> list[Run]:

        check_list_limit(limit)
        return (await self._get("/v1/runs", RunsResponse, {"limit": limit})).runs

    async def add_run_metrics(self, run_id: str, step: int, values: Mapping[str, float]) -> RunMetrics:

        check_step(step)
        body = RunMetricsRequest(step=step, values=check_metric_values(values))
        return await self._post(f"{_path(run_id)}/metrics", body, RunMetrics, idempotent=False)

    async def get_run_metrics(self, run_id: str, *, after_seq: int | None = None) -> list[RunMetrics]:

        check_after_seq(after_seq)
        params = None if after_seq is None else {"after_seq": after_seq}
        return (await self._get(f"{_path(run_id)}/metrics", RunMetricsResponse, params)).metrics

    async def search_rollouts(self, query: RolloutSearch) -> RolloutSearchPage:
        return await self._post("/v1/rollouts/search", query, RolloutSearchPage)

    async def store_health(self) -> StoreHealth:
        return await self._get("/v1/store/health", StoreHealth)
