"""The store server's wire format for runs: the bodies of the run routes that are not store
types themselves, shared by the server (:mod:`agentbolt.store.server.run_routes`) and the HTTP client
(:mod:`agentbolt.store.run_http`). Importing it is cheap (no FastAPI)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from .. import types as t
from .run_records import Run, RunMetrics, RunStatus

__all__ = ["FinishRunRequest", "RunMetricsRequest", "RunMetricsResponse", "RunsResponse"]


class FinishRunRequest(BaseModel):
    """Body of ``POST /v1/runs/{run_id}/finish``."""

    status: RunStatus
    """The final status."""
    error: str | None = None
    """Why the run failed."""


class RunMetricsRequest(BaseModel):
    """Body of ``POST /v1/runs/{run_id}/metrics``."""

    model_config = ConfigDict(allow_inf_nan=False)

    step: t.Int64
    """The algorithm's step."""
    values: dict[str, float] = Field(default_factory=dict)
    """Metric name -> finite value."""


class RunsResponse(BaseModel):
    """Answer of ``GET /v1/runs``."""

    runs: list[Run]


class RunMetricsResponse(BaseModel):
    """Answer of ``GET /v1/runs/{run_id}/metrics``."""

    metrics: list[RunMetrics]
