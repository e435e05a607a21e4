"""The store server's routes, one per store operation, derived from its declaration
(:mod:`agentbolt.store.operations`): the path and method, the request body (``POST``) or query
(``GET``), the response model and the OpenAPI documentation all come from it. A route validates
the request, calls the same-named method of the store and answers ``{returns: result}``.

Waiting operations (``dequeue``, ``wait_for_rollouts``) are bounded on the server: one request
waits at most ``max_wait_s`` (the client loops until its own time is up), and a request whose
client disconnects, or that is still waiting when the server stops, is cancelled (so it never
claims work nobody will receive) and answers 503 (``StoreUnavailableError``: ask again).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

from fastapi import FastAPI, Path, Query, Request
from starlette.responses import Response

from ...errors import StoreUnavailableError
from ..base import Store
from ..operations import Operation, operations
from .front import ok
from .http_errors import ERROR_DOCS

__all__ = ["Waits", "add_operation_routes"]

log = logging.getLogger(__name__)

R = TypeVar("R")


class Waits:
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


def add_operation_routes(app: FastAPI, store: Store, waits: Waits) -> None:
    """Add a route for every operation declared on :class:`~agentbolt.store.Store`."""
    for op in operations(Store):
        endpoint = _endpoint(op, store, waits)
        app.add_api_route(
            _route_path(op),
            endpoint,
            methods=[op.method],
            response_model=op.response,
            operation_id=op.name,
            tags=[op.tag],
            summary=op.summary,
            description=op.description,
            responses=ERROR_DOCS,
        )


def _route_path(op: Operation) -> str:
    return op.path


def _endpoint(op: Operation, store: Store, waits: Waits) -> Callable[..., Awaitable[Response]]:
    """The route's handler, with a signature FastAPI reads the request's parts from."""
    method = getattr(store, op.name)
    wire = op.wire_request

    async def endpoint(request: Request, **parts: Any) -> Response:
        arguments = {name: parts[name] for name in op.path_params}
        sent = parts.get("_wire")
        if sent is not None:
            if op.body is not None:
                arguments[op.body] = sent
            else:
                arguments.update(sent.__dict__)
        if op.waits is None:
            return ok(op.answer(await method(**arguments)))
        return ok(op.answer(await _wait(op, method, arguments, request, waits)))

    params = [inspect.Parameter("request", inspect.Parameter.KEYWORD_ONLY, annotation=Request)]
    annotation: Any  # types built at run time from the declaration, for FastAPI to read
    for name in op.path_params:
        annotation = Annotated[op.parameters[name].annotation, Path(description=op.arg_docs.get(name))]
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation))
    if wire is not None:
        annotation = wire if op.method == "POST" else Annotated[wire, Query()]
        params.append(inspect.Parameter("_wire", inspect.Parameter.KEYWORD_ONLY, annotation=annotation))
    endpoint.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]  # what FastAPI reads the parameters from
    endpoint.__name__ = op.name
    return endpoint


async def _wait(
    op: Operation, method: Callable[..., Awaitable[Any]], arguments: dict[str, Any], request: Request, waits: Waits
) -> Any:
    """A waiting call, bounded by the server's ``max_wait_s`` and abandoned when nobody waits for
    its answer any more."""
    assert op.waits is not None
    seconds = arguments[op.waits] = waits.bound(arguments[op.waits])
    if seconds <= 0:
        return await method(**arguments)
    delivered, result = await waits.run(request, method(**arguments))
    if not delivered:  # the client left (nobody reads this), or the server is stopping
        raise StoreUnavailableError(f"the store server stopped while {op.name} waited; ask again (another server)")
    if result and op.lost_answer and await request.is_disconnected():
        log.warning("the client of %s disconnected before its answer was sent: %s", op.name, op.lost_answer)
    return result
