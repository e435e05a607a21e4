"""The store server: the whole :class:`~agentbolt.store.Store` protocol over HTTP (FastAPI).

Build the app with :func:`create_app` and serve it with any ASGI server, or run
``agentbolt store serve``. Every store operation is a route derived from its declaration on
:class:`~agentbolt.store.Store` (:mod:`.routes`; JSON bodies, answers name their payload)::

    POST /v1/rollouts                         enqueue many        {"specs": [...]}
    POST /v1/rollouts/get                     get many            {"rollout_ids": [...]}
    GET  /v1/rollouts                         query               ?status=&mode=&group_id=&limit=&cursor=
    GET  /v1/rollouts/counts                  count per status    ?group_id=
    POST /v1/rollouts/dequeue                 claim under a lease, waiting up to wait_s (capped)
    POST /v1/rollouts/wait                    wait until final, up to timeout (capped)
    POST /v1/rollouts/cancel                  cancel many
    POST /v1/rollouts/purge                   delete finished rollouts
    POST /v1/rollouts/search                  filtered, paginated rollouts (newest first)
    GET  /v1/rollouts/{rollout_id}/attempts   attempts of a rollout
    POST /v1/attempts/heartbeat               renew many leases
    POST /v1/attempts/finish                  report the end of an attempt
    POST /v1/spans                            add spans of many rollouts
    POST /v1/spans/query                      spans of many rollouts
    POST /v1/resources                        add a resources snapshot
    GET  /v1/resources                        the latest snapshot, or ?version=
    POST /v1/sweep                            apply due deadlines and leases now
    POST /v1/runs, GET /v1/runs[/{run_id}]    start, list, get runs
    POST /v1/runs/{run_id}/finish|metrics     finish a run, record a step's metrics
    GET  /v1/runs/{run_id}/metrics            recorded metrics
    GET  /v1/store/health                     queue, attempts, failures, runners

and, written here, ``POST /v1/traces`` (OTLP/HTTP export, protobuf or JSON, gzip) and
``GET /v1/health`` (liveness, no token needed). ``/openapi.json`` documents them all.

Errors answer ``{"error": {"type": "NotFoundError", "message": "..."}}`` with 404 (not found),
409 (conflict, stale attempt, invalid transition), 400 (misuse), 422 (malformed request or
data), 401 (token), 413 (too large), 415 (not JSON), 421 (a tokenless server addressed by a
non-local host name), 503 (store unavailable) or 500 (unexpected: a generic message; the
traceback goes to the server log, never into a response).

What runs before routing (token, ``Host`` check, size limit, the span-ingest fast path) is
:mod:`.front`, the error responses :mod:`.http_errors`, the OTLP route :mod:`.otlp_route`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from ... import __version__
from ...errors import UserError
from .. import wire as w
from ..base import Store
from .front import OPEN_PATHS, Front, ok
from .http_errors import error_response, error_status
from .otlp_route import OTLP_DOCS, export_traces
from .routes import Waits, add_operation_routes

__all__ = ["DEFAULT_MAX_REQUEST_BYTES", "DEFAULT_MAX_WAIT_S", "create_app", "error_status"]

log = logging.getLogger(__name__)

DEFAULT_MAX_WAIT_S = 30.0
"""Longest a single request waits in ``dequeue`` or ``wait_for_rollouts``."""
DEFAULT_MAX_REQUEST_BYTES = 64 * 1024 * 1024
"""Largest request body accepted (after decompression for OTLP)."""


class _GuardedRoute(APIRoute):
    """Turns every exception of a route (validation included) into a JSON error response."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def guarded(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as exc:
                return error_response(exc, request)

        return guarded


def create_app(
    store: Store,
    *,
    token: str | None = None,
    max_wait_s: float = DEFAULT_MAX_WAIT_S,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    close_store: bool = False,
) -> FastAPI:
    """The store server for ``store`` as an ASGI app.

    Args:
        store: the backend every request goes to.
        token: when set, every endpoint but ``/v1/health`` and the documentation requires
            ``Authorization: Bearer <token>``.
        max_wait_s: longest one request waits in ``dequeue`` / ``wait_for_rollouts``.
        max_request_bytes: largest request body (after gzip decompression for OTLP).
        close_store: close the store when the app shuts down.
    """
    if max_wait_s <= 0:
        raise UserError(f"max_wait_s must be positive, got {max_wait_s}")
    waits = Waits(max_wait_s)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            waits.stopping.set()
            if close_store:
                await store.close()

    app = FastAPI(
        title="agentbolt store server",
        version=__version__,
        description=(
            "The agentbolt store protocol over HTTP: rollouts, attempts, spans and resources, plus "
            "OTLP/HTTP trace ingest at `/v1/traces`. Open it from Python with "
            "`agentbolt.store.open_store('http://host:port')`. A server started with a token answers only "
            "requests that send `Authorization: Bearer <token>`."
        ),
        lifespan=lifespan,
        separate_input_output_schemas=False,
        # The server stores the traces of agents: its own request spans, sent to the process's
        # global OpenTelemetry provider (often pointed at this very server), must never mix in.
        telemetry={"tracing": False, "metrics": False, "logs": False, "auto_configure": False},
    )
    app.router.route_class = _GuardedRoute
    app.state.waits = waits

    async def http_error(request: Request, exc: Exception) -> Response:
        return error_response(exc, request)

    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_middleware(Front, token=token, max_request_bytes=max_request_bytes, store=store)
    add_operation_routes(app, store, waits)
    _add_own_routes(app, store, max_request_bytes)
    _add_openapi(app, secured=token is not None)
    return app


def _add_own_routes(app: FastAPI, store: Store, max_request_bytes: int) -> None:
    """The routes that are no store operation: OTLP ingest and liveness."""

    @app.post(
        "/v1/traces",
        operation_id="otlp_export_traces",
        tags=["spans"],
        openapi_extra=OTLP_DOCS,
        responses={200: {"description": "An OTLP `ExportTraceServiceResponse`."}},
    )
    async def otlp_traces(request: Request) -> Response:
        """OTLP/HTTP trace export: spans are stored under their ``agentbolt.rollout_id``."""
        return await export_traces(request, store, max_request_bytes)

    @app.get("/v1/health", response_model=w.HealthResponse, operation_id="health", tags=["maintenance"])
    async def health() -> Response:
        """Liveness: answers without a token."""
        return ok(w.HealthResponse.model_construct(status="ok", version=__version__))


# -- OpenAPI --------------------------------------------------------------------------------------


def _add_openapi(app: FastAPI, *, secured: bool) -> None:
    """OpenAPI with, when the server has a token, bearer security on every route but the open ones."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
                separate_input_output_schemas=False,
            )
            if secured:
                schema["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
                schema["security"] = [{"bearer": []}]
                for path in OPEN_PATHS & set(schema.get("paths", {})):
                    for operation in schema["paths"][path].values():
                        operation["security"] = []
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to customise the schema
