"""The ingest process's doors: OTLP/HTTP and OTLP/gRPC receivers, feedback and status over HTTP.

- ``POST /v1/traces``: OTLP/HTTP (protobuf or JSON, optionally gzip), the store server's codec
  (:mod:`agentbolt.store.server.otlp`); answers ``partial_success`` for rejected spans and 503
  (which exporters retry) when the store is unavailable;
- OTLP/gRPC ``opentelemetry.proto.collector.trace.v1.TraceService/Export`` (grpcio, the
  opentelemetry-proto service stubs), on its own port; ``UNAVAILABLE`` (retried by exporters)
  when the store is;
- ``POST /v1/feedback``: a :class:`~.rewards.TraceFeedback`; 404 for a trace that never arrived,
  422 for a reward that is not a finite number;
- ``GET /v1/traces/status``: one row per traced rollout.

:class:`IngestServer` runs both receivers and the ingestor's keeper on one event loop (the
foreground of ``agentbolt ingest``); :class:`IngestThread` runs it on a background thread (tests,
notebooks).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import socket
import threading
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Self, TypeVar

from fastapi import FastAPI, HTTPException, Request
from starlette.responses import Response

from ..errors import MissingDependencyError, StoreUnavailableError
from ..store.base import Store
from ..store.server import otlp
from ..store.server.otlp_route import OTLP_DOCS, decode_export, otlp_error, summarize_rejections
from .ingest import TraceIngestor, UnknownTrace, status_row
from .rewards import TraceFeedback

__all__ = ["DEFAULT_GRPC_PORT", "DEFAULT_HTTP_PORT", "IngestServer", "IngestThread", "create_ingest_app"]

log = logging.getLogger(__name__)

DEFAULT_HTTP_PORT = 4318
"""OTLP/HTTP's registered port (what exporters default to)."""
DEFAULT_GRPC_PORT = 4317
"""OTLP/gRPC's registered port."""
MAX_REQUEST_BYTES = 64 * 1024 * 1024
_SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
T = TypeVar("T")


def create_ingest_app(ingestor: TraceIngestor, *, max_request_bytes: int = MAX_REQUEST_BYTES) -> FastAPI:
    """The HTTP side of the ingest process (see the module docstring)."""
    app = FastAPI(title="agentbolt ingest", summary="OTLP traces of deployed agents as rollouts of a run.")

    @app.post("/v1/traces", openapi_extra=OTLP_DOCS)
    async def traces(request: Request) -> Response:
        decoded = await decode_export(request, max_request_bytes)
        if isinstance(decoded, Response):
            return decoded
        fmt, spans, rejected = decoded
        try:
            rejected.extend(await ingestor.ingest(spans))
        except StoreUnavailableError as exc:
            return otlp_error(fmt, 503, str(exc))
        return Response(otlp.encode_response(fmt, len(rejected), summarize_rejections(rejected)), media_type=fmt)

    @app.post("/v1/feedback")
    async def feedback(body: TraceFeedback) -> dict[str, Any]:
        try:
            state = await ingestor.feedback(body)
        except UnknownTrace as exc:
            raise HTTPException(404, str(exc)) from None
        return {"feedback_id": body.feedback_id, **status_row(state)}

    @app.get("/v1/traces/status")
    async def status() -> dict[str, Any]:
        return {"run_id": ingestor.run_id, "rejected_spans": ingestor.rejected, "rollouts": ingestor.status()}

    @app.get("/healthz")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    return app


def _grpc_servicer(ingestor: TraceIngestor) -> Any:
    """A ``TraceServiceServicer`` storing what it receives through ``ingestor``."""
    try:
        import grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
    except ImportError:
        raise MissingDependencyError(
            "grpcio", "'agentbolt[grpc]'", "the OTLP/gRPC receiver (agentbolt ingest --no-grpc receives OTLP/HTTP only)"
        ) from None

    class Servicer(trace_service_pb2_grpc.TraceServiceServicer):
        async def Export(self, request: Any, context: Any) -> Any:
            spans, rejected = otlp.decode_request(request)
            try:
                rejected.extend(await ingestor.ingest(spans))
            except StoreUnavailableError as exc:
                await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
            response = ExportTraceServiceResponse()
            if rejected:
                response.partial_success.rejected_spans = len(rejected)
                response.partial_success.error_message = summarize_rejections(rejected)
            return response

    return Servicer(), trace_service_pb2_grpc.add_TraceServiceServicer_to_server


class IngestServer:
    """The ingest process: OTLP/HTTP (+ feedback, status) on ``http_port``, OTLP/gRPC on
    ``grpc_port`` (``None``: no gRPC), the ingestor's keeper; all on the running event loop.
    Port 0 picks a free port (read :attr:`http_port` / :attr:`grpc_port` after :meth:`start`)."""

    def __init__(
        self,
        ingestor: TraceIngestor,
        *,
        host: str = "127.0.0.1",
        http_port: int = DEFAULT_HTTP_PORT,
        grpc_port: int | None = DEFAULT_GRPC_PORT,
    ) -> None:
        self.ingestor = ingestor
        self.host = host
        self.http_port = http_port
        self.grpc_port = grpc_port
        self._uvicorn: Any = None
        self._http_task: asyncio.Task[None] | None = None
        self._grpc: Any = None

    async def start(self) -> None:
        import uvicorn

        await self.ingestor.start()
        if self.grpc_port is not None:
            import grpc

            servicer, add = _grpc_servicer(self.ingestor)
            limit = ("grpc.max_receive_message_length", MAX_REQUEST_BYTES)  # gRPC's default is 4 MiB
            self._grpc = grpc.aio.server(options=[limit])
            add(servicer, self._grpc)
            bound = self._grpc.add_insecure_port(f"{self.host}:{self.grpc_port}")
            if not bound:
                raise OSError(f"cannot listen for OTLP/gRPC on {self.host}:{self.grpc_port}")
            self.grpc_port = bound
            await self._grpc.start()
        sock = socket.create_server((self.host, self.http_port))
        self.http_port = sock.getsockname()[1]
        config = uvicorn.Config(create_ingest_app(self.ingestor), lifespan="off", log_level="warning")
        self._uvicorn = uvicorn.Server(config)
        self._http_task = asyncio.get_running_loop().create_task(self._uvicorn.serve(sockets=[sock]))
        while not self._uvicorn.started:
            if self._http_task.done():
                self._http_task.result()
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True
        if self._http_task is not None:
            await self._http_task
            self._http_task = None
        if self._grpc is not None:
            await self._grpc.stop(grace=1.0)
            self._grpc = None
        await self.ingestor.stop()

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    @property
    def grpc_endpoint(self) -> str | None:
        return None if self.grpc_port is None else f"{self.host}:{self.grpc_port}"


class IngestThread:
    """An :class:`IngestServer` on its own event loop in a daemon thread.

    ``make(store)`` builds the ingestor from the store opened (on the thread's loop) from
    ``store_url``; :meth:`call` runs a coroutine function of the ingestor on that loop::

        with IngestThread("memory://", lambda store: TraceIngestor(store, "prod")) as ingest:
            ...  # point exporters at ingest.http_url + "/v1/traces" or ingest.grpc_endpoint
            ingest.call(lambda ingestor: ingestor.complete_all())
    """

    def __init__(
        self,
        store_url: str,
        make: Callable[[Store], TraceIngestor],
        *,
        http_port: int = 0,
        grpc_port: int | None = 0,
        timeout_s: float = 300.0,
    ) -> None:
        self.store_url = store_url
        self.make = make
        self._ports = (http_port, grpc_port)
        self.timeout_s = timeout_s
        """How long starting (opening the store, binding the ports) and stopping may take."""
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self.server: IngestServer | None = None

    def __enter__(self) -> Self:
        self._thread = threading.Thread(target=self._loop.run_forever, name="agentbolt-ingest", daemon=True)
        self._thread.start()
        started = self._submit(self._start())
        try:
            started.result(self.timeout_s)
        except BaseException:  # a failed or stuck start leaves no thread, loop or port behind
            started.cancel()
            try:
                self.__exit__(None, None, None)
            except Exception:
                log.exception("cleaning up after the failed start of the ingest thread failed")
            raise
        return self

    async def _start(self) -> None:
        from ..store import open_store

        store = open_store(self.store_url)
        self.server = IngestServer(self.make(store), http_port=self._ports[0], grpc_port=self._ports[1])
        await self.server.start()

    async def _stop(self) -> None:
        if self.server is not None:
            await self.server.stop()
            await self.server.ingestor.store.close()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        try:
            self._submit(self._stop()).result(self.timeout_s)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self._thread is not None:
                self._thread.join(30)
            self._loop.close()

    def _submit(self, coro: Awaitable[T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)  # type: ignore[arg-type]

    def call(self, fn: Callable[[TraceIngestor], Awaitable[T]], timeout: float = 300.0) -> T:
        """Run ``fn(ingestor)`` on the ingest loop; its result."""
        assert self.server is not None

        async def run() -> T:
            assert self.server is not None
            return await fn(self.server.ingestor)

        return self._submit(run()).result(timeout)

    @property
    def http_url(self) -> str:
        assert self.server is not None
        return self.server.http_url

    @property
    def grpc_endpoint(self) -> str:
        assert self.server is not None and self.server.grpc_endpoint is not None
        return self.server.grpc_endpoint
