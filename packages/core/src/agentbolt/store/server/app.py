"""The store server: the whole :class:`~agentbolt.store.Store` protocol over HTTP (FastAPI).

Build the app with :func:`create_app` and serve it with any ASGI server, or run
``agentbolt store serve``. Endpoints (JSON bodies; responses name their payload)::

    POST /v1/rollouts                         enqueue many        {"specs": [...]}
    POST /v1/rollouts/get                     get many            {"rollout_ids": [...]}
    GET  /v1/rollouts                         query               ?status=&mode=&group_id=&limit=&cursor=
    GET  /v1/rollouts/counts                  count per status    ?group_id=
    POST /v1/rollouts/dequeue                 claim under a lease, waiting up to wait_s (capped)
    POST /v1/rollouts/wait                    wait until final, up to timeout (capped)
    POST /v1/rollouts/cancel                  cancel many
    POST /v1/rollouts/purge                   delete finished rollouts
    GET  /v1/rollouts/{rollout_id}/attempts   attempts of a rollout
    POST /v1/attempts/heartbeat               renew many leases
    POST /v1/attempts/finish                  report the end of an attempt
    POST /v1/spans                            add spans of many rollouts
    POST /v1/spans/query                      spans of many rollouts
    POST /v1/resources                        add a resources snapshot
    GET  /v1/resources                        the latest snapshot, or ?version=
    POST /v1/sweep                            apply due deadlines and leases now
    POST /v1/traces                           OTLP/HTTP export (protobuf or JSON, gzip)
    GET  /v1/health                           liveness (no token needed)

plus the runs, rollout-search and queue-health routes of :mod:`agentbolt.store.server.run_routes`.

Errors answer ``{"error": {"type": "NotFoundError", "message": "..."}}`` with 404 (not found),
409 (conflict, stale attempt, invalid transition), 400 (misuse), 422 (malformed request or
data), 401 (token), 413 (too large), 415 (not JSON), 421 (a tokenless server addressed by a
non-local host name), 503 (store unavailable) or 500 (unexpected: a generic message; the
traceback goes to the server log, never into a response).

Blocking calls are bounded on the server: one request waits at most ``max_wait_s`` and the
client loops until its own timeout. A waiting request whose client disconnects is cancelled,
so it never claims work nobody will receive.

This module holds the routes; what runs before routing (token, ``Host`` check, size limit, the
span-ingest fast path) is :mod:`.front`, the error responses :mod:`.http_errors`, the OTLP
route :mod:`.otlp_route`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Annotated, Any, TypeVar

from fastapi import FastAPI, Query, Request
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from ... import __version__
from ... import types as t
from ...errors import (
    UserError,
)
from .. import wire as w
from ..base import Store
from .front import OPEN_PATHS, Front, ingest_spans, ok
from .http_errors import ERROR_DOCS, JSON, error_response, error_status
from .otlp_route import OTLP_DOCS, export_traces
from .run_routes import add_run_routes

__all__ = ["DEFAULT_MAX_REQUEST_BYTES", "DEFAULT_MAX_WAIT_S", "create_app", "error_status"]

log = logging.getLogger(__name__)

R = TypeVar("R")

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


class _Waits:
    """Bounded, cancellable waits: a waiting store call ends when its client disconnects or the
    server begins to shut down, instead of running on for nobody."""

    def __init__(self, max_wait_s: float) -> None:
        self.max_wait_s = max_wait_s
        self.stopping = asyncio.Event()

    def bound(self, seconds: float | None) -> float:
        """``seconds`` capped to the per-request maximum (``None`` means the maximum)."""
        if seconds is None:
            return self.max_wait_s
        return min(max(seconds, 0.0), self.max_wait_s)

    async def run(self, request: Request, call: Awaitable[R]) -> tuple[bool, R | None]:
        """``(True, result)``, or ``(False, None)`` when the wait was abandoned."""
        task = asyncio.ensure_future(call)
        gone = asyncio.ensure_future(_disconnected(request))
        stop = asyncio.ensure_future(self.stopping.wait())
        try:
            await asyncio.wait({task, gone, stop}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # this request was cancelled: leave no store call running for nobody
            task.cancel()
            raise
        finally:
            gone.cancel()
            stop.cancel()
        if task.done():
            return True, task.result()
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return False, None
        result = task.result()  # it finished in between: nobody may be left to receive it
        return True, result


async def _disconnected(request: Request) -> None:
    """Return when the client closes the connection (the request body was already read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


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
    waits = _Waits(max_wait_s)

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
    _add_store_routes(app, store, waits, max_request_bytes)
    add_run_routes(app, store, {"responses": ERROR_DOCS})  # runs, metrics, search, health
    _add_openapi(app, secured=token is not None)
    return app


def _add_store_routes(app: FastAPI, store: Store, waits: _Waits, max_request_bytes: int) -> None:
    post, get = app.post, app.get
    docs: dict[str, Any] = {"responses": ERROR_DOCS}  # keyword arguments of every route decorator

    # -- rollouts ---------------------------------------------------------------------------------

    @post("/v1/rollouts", response_model=w.RolloutsResponse, operation_id="enqueue", tags=["rollouts"], **docs)
    async def enqueue(body: w.EnqueueRequest) -> Response:
        """Queue rollouts in order; idempotent on caller-supplied ``rollout_id``."""
        return ok(w.RolloutsResponse.model_construct(rollouts=await store.enqueue(body.specs)))

    @post("/v1/rollouts/get", response_model=w.RolloutsResponse, operation_id="get_rollouts", tags=["rollouts"], **docs)
    async def get_rollouts(body: w.GetRolloutsRequest) -> Response:
        """Many rollouts by id, in the order given."""
        return ok(w.RolloutsResponse.model_construct(rollouts=await store.get_rollouts(body.rollout_ids)))

    @get("/v1/rollouts", response_model=t.Page[t.Rollout], operation_id="query_rollouts", tags=["rollouts"], **docs)
    async def query_rollouts(
        status: Annotated[list[t.RolloutStatus] | None, Query(description="Any of these statuses.")] = None,
        mode: Annotated[t.RolloutMode | None, Query(description="Only this mode.")] = None,
        group_id: Annotated[str | None, Query(description="Only this group.")] = None,
        limit: Annotated[int, Query(description="Page size.", ge=1, le=w.MAX_LIMIT)] = 100,
        cursor: Annotated[str | None, Query(description="`next_cursor` of the previous page.")] = None,
    ) -> Response:
        """Rollouts matching every filter, in enqueue order, one page at a time."""
        page = await store.query_rollouts(status=status, mode=mode, group_id=group_id, limit=limit, cursor=cursor)
        return ok(page)

    @get(
        "/v1/rollouts/counts", response_model=w.CountsResponse, operation_id="count_rollouts", tags=["rollouts"], **docs
    )
    async def count_rollouts(group_id: Annotated[str | None, Query(description="Only this group.")] = None) -> Response:
        """How many rollouts are in each status."""
        return ok(w.CountsResponse.model_construct(counts=await store.count_rollouts(group_id=group_id)))

    @post(
        "/v1/rollouts/wait", response_model=w.WaitResponse, operation_id="wait_for_rollouts", tags=["rollouts"], **docs
    )
    async def wait_for_rollouts(body: w.WaitRequest, request: Request) -> Response:
        """Wait until every rollout is final or the (server-capped) timeout passes."""
        timeout = waits.bound(body.timeout)
        states: list[t.Rollout] | None = None
        if timeout > 0:
            _, states = await waits.run(request, store.wait_for_rollouts(body.rollout_ids, timeout))
        if states is None:
            states = await store.get_rollouts(body.rollout_ids)
        done = all(r.status.is_final for r in states)
        return ok(w.WaitResponse.model_construct(rollouts=states, done=done))

    @post("/v1/rollouts/cancel", response_model=w.RolloutsResponse, operation_id="cancel", tags=["rollouts"], **docs)
    async def cancel(body: w.CancelRequest) -> Response:
        """Cancel unfinished rollouts; their running attempts fail with kind ``cancelled``."""
        return ok(w.RolloutsResponse.model_construct(rollouts=await store.cancel(body.rollout_ids, reason=body.reason)))

    @post("/v1/rollouts/purge", response_model=w.PurgeResponse, operation_id="purge", tags=["rollouts"], **docs)
    async def purge(body: w.PurgeRequest) -> Response:
        """Delete finished rollouts with their attempts and spans."""
        purged = await store.purge(rollout_ids=body.rollout_ids, older_than_s=body.older_than_s)
        return ok(w.PurgeResponse.model_construct(purged=purged))

    @post("/v1/rollouts/dequeue", response_model=w.ClaimsResponse, operation_id="dequeue", tags=["attempts"], **docs)
    async def dequeue(body: w.DequeueRequest, request: Request) -> Response:
        """Claim up to ``limit`` queued rollouts under a lease, waiting (server-capped) for work."""
        wait_s = waits.bound(body.wait_s)
        call = store.dequeue(body.worker_id, limit=body.limit, lease_s=body.lease_s, mode=body.mode, wait_s=wait_s)
        if wait_s <= 0:
            claims = await call
        else:
            delivered, result = await waits.run(request, call)
            claims = result or []
            if delivered and claims and await request.is_disconnected():
                log.warning(
                    "worker %s disconnected while its dequeue claimed %s; their leases expire in %s s and "
                    "the store requeues them then",
                    body.worker_id,
                    [c.rollout.rollout_id for c in claims],
                    body.lease_s,
                )
        return ok(w.ClaimsResponse.model_construct(claims=claims))

    @get(
        "/v1/rollouts/{rollout_id:path}/attempts",
        response_model=w.AttemptsResponse,
        operation_id="get_attempts",
        tags=["attempts"],
        **docs,
    )
    async def get_attempts(rollout_id: str) -> Response:
        """The attempts of a rollout, oldest first."""
        return ok(w.AttemptsResponse.model_construct(attempts=await store.get_attempts(rollout_id)))

    # -- attempts ---------------------------------------------------------------------------------

    @post(
        "/v1/attempts/heartbeat", response_model=w.AttemptsResponse, operation_id="heartbeat", tags=["attempts"], **docs
    )
    async def heartbeat(body: w.HeartbeatRequest) -> Response:
        """Renew leases; returns every attempt's state (stop the agent of one that is not running)."""
        attempts = await store.heartbeat(body.attempt_ids, lease_s=body.lease_s)
        return ok(w.AttemptsResponse.model_construct(attempts=attempts))

    @post(
        "/v1/attempts/finish",
        response_model=w.RolloutResponse,
        operation_id="finish_attempt",
        tags=["attempts"],
        **docs,
    )
    async def finish_attempt(body: w.FinishRequest) -> Response:
        """Report the end of an attempt (``succeeded`` or ``failed``); returns the rollout."""
        rollout = await store.finish_attempt(body.attempt_id, body.status, reward=body.reward, error=body.error)
        return ok(w.RolloutResponse.model_construct(rollout=rollout))

    # -- spans ------------------------------------------------------------------------------------

    @post(
        "/v1/spans",
        response_model=w.AddSpansResponse,
        operation_id="add_spans",
        tags=["spans"],
        openapi_extra=_json_body("AddSpansRequest"),
        **docs,
    )
    async def add_spans(request: Request) -> Response:
        """Store spans of many rollouts in one transaction (idempotent on rollout and span id)."""
        return await ingest_spans(store, await request.body())

    @post("/v1/spans/query", response_model=w.SpansResponse, operation_id="query_spans", tags=["spans"], **docs)
    async def query_spans(body: w.QuerySpansRequest) -> Response:
        """The spans of many rollouts, each list in ``seq`` order."""
        spans = await store.query_spans(
            body.rollout_ids, latest_attempt_only=body.latest_attempt_only, after_seq=body.after_seq
        )
        return ok(w.SpansResponse.model_construct(spans=spans))

    @post(
        "/v1/traces",
        operation_id="otlp_export_traces",
        tags=["spans"],
        openapi_extra=OTLP_DOCS,
        responses={200: {"description": "An OTLP `ExportTraceServiceResponse`."}},
    )
    async def otlp_traces(request: Request) -> Response:
        """OTLP/HTTP trace export: spans are stored under their ``agentbolt.rollout_id``."""
        return await export_traces(request, store, max_request_bytes)

    # -- resources and maintenance ----------------------------------------------------------------

    @post("/v1/resources", response_model=w.ResourcesResponse, operation_id="add_resources", tags=["resources"], **docs)
    async def add_resources(body: t.Resources) -> Response:
        """Store a resources snapshot under the next version."""
        return ok(w.ResourcesResponse.model_construct(resources=await store.add_resources(body)))

    @get("/v1/resources", response_model=w.ResourcesResponse, operation_id="get_resources", tags=["resources"], **docs)
    async def get_resources(
        version: Annotated[
            int | None, Query(description="A version; the latest when omitted.", ge=1, le=t.INT64_MAX)
        ] = None,
    ) -> Response:
        """A resources version, or the latest (``null`` when none exists yet)."""
        return ok(w.ResourcesResponse.model_construct(resources=await store.get_resources(version)))

    @post("/v1/sweep", response_model=w.SweepResponse, operation_id="sweep", tags=["maintenance"], **docs)
    async def sweep() -> Response:
        """Apply due deadlines and expired leases now (the server also sweeps in the background)."""
        return ok(w.SweepResponse.model_construct(ended=await store.sweep()))

    @get("/v1/health", response_model=w.HealthResponse, operation_id="health", tags=["maintenance"])
    async def health() -> Response:
        """Liveness: answers without a token."""
        return ok(w.HealthResponse.model_construct(status="ok", version=__version__))


# -- OpenAPI --------------------------------------------------------------------------------------


def _json_body(schema_name: str) -> dict[str, Any]:
    ref = {"$ref": f"#/components/schemas/{schema_name}"}
    return {"requestBody": {"required": True, "content": {JSON: {"schema": ref}}}}


def _add_openapi(app: FastAPI, *, secured: bool) -> None:
    """OpenAPI with the raw-body routes' request schemas and, with a token, bearer security."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
                separate_input_output_schemas=False,
            )
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            extra = w.AddSpansRequest.model_json_schema(ref_template="#/components/schemas/{model}")
            for name, sub in extra.pop("$defs", {}).items():
                components.setdefault(name, sub)
            components["AddSpansRequest"] = extra
            if secured:
                schema["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
                schema["security"] = [{"bearer": []}]
                for path in OPEN_PATHS & set(schema.get("paths", {})):
                    for operation in schema["paths"][path].values():
                        operation["security"] = []
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to customise the schema
