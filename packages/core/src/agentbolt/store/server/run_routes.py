"""Store-server routes for runs, run metrics, rollout search and queue health.

::

    POST /v1/runs                          start a run                     RunSpec
    GET  /v1/runs                          newest runs first               ?limit=
    GET  /v1/runs/{run_id}                 one run
    POST /v1/runs/{run_id}/finish          give a run its final status     {"status": ..., "error": ...}
    POST /v1/runs/{run_id}/metrics         record a step's metrics         {"step": 3, "values": {...}}
    GET  /v1/runs/{run_id}/metrics         recorded metrics                ?after_seq=
    POST /v1/rollouts/search               filtered, paginated rollouts    RolloutSearch
    GET  /v1/store/health                  queue, attempts, failures, runners
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any

from fastapi import FastAPI, Query
from pydantic import BaseModel
from starlette.responses import Response

from ...types import INT64_MAX, INT64_MIN
from ..base import Store
from ..run_records import RolloutSearch, RolloutSearchPage, Run, RunMetrics, RunSpec, StoreHealth
from ..run_wire import FinishRunRequest, RunMetricsRequest, RunMetricsResponse, RunsResponse
from ..wire import MAX_LIMIT

__all__ = ["add_run_routes"]


def _ok(model: BaseModel) -> Response:
    return Response(model.model_dump_json(), media_type="application/json")


def add_run_routes(app: FastAPI, store: Store, docs: dict[str, Any]) -> None:
    """Add the routes above to the store server ``app``."""
    tags: list[str | Enum] = ["runs"]

    @app.post("/v1/runs", response_model=Run, operation_id="start_run", tags=tags, **docs)
    async def start_run(body: RunSpec) -> Response:
        """Record a new running run."""
        return _ok(await store.start_run(body))

    @app.get("/v1/runs", response_model=RunsResponse, operation_id="list_runs", tags=tags, **docs)
    async def list_runs(
        limit: Annotated[int, Query(ge=1, le=MAX_LIMIT, description="Most runs returned.")] = 100,
    ) -> Response:
        """The newest runs first."""
        return _ok(RunsResponse.model_construct(runs=await store.list_runs(limit=limit)))

    @app.post("/v1/runs/{run_id}/finish", response_model=Run, operation_id="finish_run", tags=tags, **docs)
    async def finish_run(run_id: str, body: FinishRunRequest) -> Response:
        """Give a running run its final status."""
        return _ok(await store.finish_run(run_id, body.status, error=body.error))

    @app.post("/v1/runs/{run_id}/metrics", response_model=RunMetrics, operation_id="add_run_metrics", tags=tags, **docs)
    async def add_run_metrics(run_id: str, body: RunMetricsRequest) -> Response:
        """Record a step's metrics."""
        return _ok(await store.add_run_metrics(run_id, body.step, body.values))

    @app.get(
        "/v1/runs/{run_id}/metrics",
        response_model=RunMetricsResponse,
        operation_id="get_run_metrics",
        tags=tags,
        **docs,
    )
    async def get_run_metrics(
        run_id: str,
        after_seq: Annotated[
            int | None, Query(ge=INT64_MIN, le=INT64_MAX, description="Only metrics after this seq.")
        ] = None,
    ) -> Response:
        """A run's recorded metrics in seq order."""
        return _ok(RunMetricsResponse.model_construct(metrics=await store.get_run_metrics(run_id, after_seq=after_seq)))

    @app.get("/v1/runs/{run_id}", response_model=Run, operation_id="get_run", tags=tags, **docs)
    async def get_run(run_id: str) -> Response:
        """One run."""
        return _ok(await store.get_run(run_id))

    @app.post(
        "/v1/rollouts/search",
        response_model=RolloutSearchPage,
        operation_id="search_rollouts",
        tags=["rollouts"],
        **docs,
    )
    async def search_rollouts(body: RolloutSearch) -> Response:
        """Rollouts matching every filter, newest first, one page with the total."""
        return _ok(await store.search_rollouts(body))

    @app.get("/v1/store/health", response_model=StoreHealth, operation_id="store_health", tags=["maintenance"], **docs)
    async def store_health() -> Response:
        """Queue length, attempts by status, failures by kind, retries and runners seen."""
        return _ok(await store.store_health())
