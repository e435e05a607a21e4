"""``http://host:port`` and ``https://...``: a client of the store server (``agentbolt store serve``).

Every :class:`~agentbolt.store.Store` operation is one HTTP call (two for a recognised retry of
``finish_attempt``), derived from its declaration (:mod:`agentbolt.store.operations`): the
arguments, validated here as every backend validates them, travel as the JSON body of a ``POST``
or the query of a ``GET``. Calls go through a pooled ``httpx.AsyncClient`` per event loop, so
one store object serves many coroutines, threads and successive ``asyncio.run`` calls. Store
errors come back as the same exception class with the same message.

Retries (``retries`` times, exponential backoff) happen only where they are safe (each
operation's declaration says whether it is idempotent):

- A request that never reached the server (connection refused, connect timeout, no free
  pooled connection) is retried for every method.
- After a failure that may have reached the server (lost connection, read timeout, or a 503
  from the server or a proxy), only idempotent calls are retried: reads, ``heartbeat``,
  ``cancel``, ``sweep``, ``add_spans`` (idempotent on span ids; the returned count then
  leaves out spans the lost try stored), and ``enqueue`` (made idempotent by generating the
  missing rollout ids here, before sending).
- ``finish_attempt`` and ``finish_attempts`` are retried too. If the lost try had already
  applied, the retry gets ``StaleAttemptError``; the client then reads the attempts, and if they
  ended exactly as reported, returns the rollouts' current states instead of raising (the
  operation's declared ``recover``).
- ``dequeue`` is retried too. If the lost try had already claimed rollouts, those claims are
  orphaned: nobody heartbeats them, so their leases expire after ``lease_s`` and the store
  marks the attempts ``lost`` and requeues the rollouts (using one of their attempts). A
  warning is logged when this can have happened.
- ``add_resources``, ``purge`` and the runs' writes are not retried once sent (a second try
  would store another version / report a wrong count / a second metrics row): they raise
  :class:`~agentbolt.errors.StoreUnavailableError`.

Waiting calls (``dequeue(wait_s=...)``, ``wait_for_rollouts``) are split into requests of at
most ``max_wait_s`` seconds, which the server also caps, until the result ends the wait or the
caller's time is up.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import random
import re
import ssl
import threading
from collections.abc import AsyncGenerator
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import httpx
import orjson
from pydantic import BaseModel

from .. import __version__, errors
from ..errors import (
    AgentboltError,
    AuthenticationError,
    NotFoundError,
    SchemaError,
    StaleAttemptError,
    StoreError,
    StoreUnavailableError,
    UserError,
)
from . import wire as w
from .base import Store
from .operations import Operation

__all__ = ["HttpStore"]

log = logging.getLogger(__name__)

_UNSENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
"""Transport failures that prove the request never reached the server."""


class _Call:
    """How one logical call went: whether a try that may have been applied was repeated."""

    __slots__ = ("repeated",)

    def __init__(self) -> None:
        self.repeated = False


class HttpStore(Store):
    """The store behind ``agentbolt store serve``. Open it with ``open_store("http://host:4747")``.

    Options (keyword arguments of :func:`~agentbolt.store.open_store`):
        token: bearer token the server was started with (default: ``$AGENTBOLT_STORE_TOKEN``).
        timeout_s: per-request timeout for reading an answer (default 30).
        connect_timeout_s: timeout for opening a connection (default 5).
        retries: extra tries where safe, see the module docs (default 3).
        backoff_s: first retry delay, doubled per retry (default 0.1).
        max_wait_s: longest single waiting request; longer waits loop (default 30).
        max_connections: connection pool size per event loop (default 100).
        verify: TLS verification for ``https://``: ``True``, ``False`` or an ``ssl.SSLContext``.
        transport: an ``httpx.AsyncBaseTransport`` to send requests through (tests, proxies).
        sweep_interval_s: accepted for symmetry with the other backends and ignored: the server
            sweeps.
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout_s: float = 30.0,
        connect_timeout_s: float = 5.0,
        retries: int = 3,
        backoff_s: float = 0.1,
        max_wait_s: float = 30.0,
        max_connections: int = 100,
        verify: bool | ssl.SSLContext = True,
        transport: httpx.AsyncBaseTransport | None = None,
        sweep_interval_s: float | None = None,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UserError(f"store server URL must look like 'http://host:4747', got {url!r}")
        if timeout_s <= 0 or connect_timeout_s <= 0 or max_wait_s <= 0:
            raise UserError("timeout_s, connect_timeout_s and max_wait_s must be positive")
        netloc = parts.netloc.rpartition("@")[2]  # never keep credentials in the URL
        self.url = urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
        token = token if token is not None else os.environ.get(w.TOKEN_ENV) or None
        self._headers = {"user-agent": f"agentbolt/{__version__}", "content-type": "application/json"}
        if token:
            self._headers["authorization"] = f"Bearer {token}"
        self._timeout_s = timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._retries = max(0, int(retries))
        self._backoff_s = backoff_s
        self._max_wait_s = max_wait_s
        self._limits = httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections, keepalive_expiry=15.0
        )
        self._verify = verify
        self._ssl: ssl.SSLContext | None = None  # built once, shared by every loop's client
        self._transport = transport
        self._lock = threading.Lock()
        self._clients: dict[asyncio.AbstractEventLoop, tuple[httpx.AsyncClient, AsyncGenerator[None, None]]] = {}
        self._urls: dict[str, httpx.URL] = {}
        self._closed = False

    def __repr__(self) -> str:
        return f"HttpStore({self.url!r})"

    # -- plumbing ---------------------------------------------------------------------------------

    async def _client(self) -> httpx.AsyncClient:
        """This event loop's client (httpx connections belong to the loop that opened them)."""
        if self._closed:
            raise UserError("this store is closed; open a new one with open_store()")
        loop = asyncio.get_running_loop()
        entry = self._clients.get(loop)
        if entry is not None:
            return entry[0]
        with self._lock:
            for old in [x for x in self._clients if x.is_closed()]:
                del self._clients[old]  # its loop ended without shutting down async generators
            if self._ssl is None:
                self._ssl = httpx.create_ssl_context(verify=self._verify)
            client = httpx.AsyncClient(
                base_url=self.url,
                headers=self._headers,
                timeout=self._timeout(0.0),
                limits=self._limits,
                verify=self._ssl,
                transport=self._transport,
            )
            # Closed with its loop: asyncio.run() finalizes async generators before closing it.
            lifetime = _lifetime(client)
            self._clients[loop] = (client, lifetime)
        await anext(lifetime)
        return client

    def _timeout(self, wait_s: float) -> httpx.Timeout:
        read = self._timeout_s + wait_s
        return httpx.Timeout(read, connect=self._connect_timeout_s, pool=read + self._max_wait_s)

    def _url(self, path: str, cache: bool) -> httpx.URL:
        url = self._urls.get(path)
        if url is None:  # parsed once: httpx would merge and re-parse a relative path per request
            url = httpx.URL(self.url + path)
            if cache:  # a fixed path, not one per id
                self._urls[path] = url
        return url

    async def _call(
        self,
        method: str,
        path: str,
        body: BaseModel | str | None = None,
        *,
        params: Any = None,
        idempotent: bool = True,
        wait_s: float = 0.0,
        call: _Call | None = None,
        cache_url: bool = True,
    ) -> bytes:
        """Send one logical call, retrying where safe; returns the response body."""
        client = await self._client()
        content = body.model_dump_json() if isinstance(body, BaseModel) else body
        url = self._url(path, cache_url)
        timeout = self._timeout(wait_s)
        tries = 0
        while True:
            try:
                response = await client.request(method, url, content=content, params=params, timeout=timeout)
            except httpx.TransportError as exc:
                unsent = isinstance(exc, _UNSENT)
                if tries < self._retries and (unsent or idempotent):
                    tries += 1
                    if not unsent and call is not None:
                        call.repeated = True
                    log.debug("%s %s failed (%r); retry %d of %d", method, path, exc, tries, self._retries)
                    await asyncio.sleep(self._backoff(tries))
                    continue
                raise self._unavailable(method, path, exc, unsent) from exc
            if response.status_code < 400:
                return response.content
            error = self._error(response)
            if isinstance(error, StoreUnavailableError) and idempotent and tries < self._retries:
                tries += 1
                if call is not None:
                    call.repeated = True
                log.debug("%s %s: %s; retry %d of %d", method, path, error, tries, self._retries)
                await asyncio.sleep(self._backoff(tries))
                continue
            raise error

    def _backoff(self, tries: int) -> float:
        return min(self._backoff_s * 2 ** (tries - 1), 2.0) * (0.5 + random.random() / 2)

    def _unavailable(self, method: str, path: str, exc: httpx.TransportError, unsent: bool) -> StoreUnavailableError:
        if isinstance(exc, httpx.PoolTimeout):
            return StoreUnavailableError(
                f"no free connection to the store server at {self.url} (all {self._limits.max_connections} busy); "
                "pass a larger max_connections to open_store()"
            )
        if unsent:
            return StoreUnavailableError(
                f"cannot reach the store server at {self.url} ({exc or type(exc).__name__}). Is it running? "
                "Start one with 'agentbolt store serve --store sqlite:///runs.db --port 4747', or check the URL."
            )
        return StoreUnavailableError(
            f"lost the answer of the store server at {self.url} to {method} {path} "
            f"({exc or type(exc).__name__}); the call may or may not have been applied"
        )

    def _error(self, response: httpx.Response) -> Exception:
        """The exception a server error response stands for."""
        status = response.status_code
        try:
            body = orjson.loads(response.content)["error"]
            type_, message = str(body["type"]), str(body["message"])
        except (orjson.JSONDecodeError, KeyError, TypeError):
            body, type_, message = None, "", response.text[:300]
        cls = getattr(errors, type_, None) if type_ else None
        if isinstance(cls, type) and issubclass(cls, AgentboltError):
            return _rebuild(cls, message, body)
        if type_ == "ValidationError":
            return SchemaError(message)
        where = f"the store server at {self.url}"
        if status in (401, 403):
            return AuthenticationError(
                f"{where} refused the request ({message}). Pass token=... to open_store() or set "
                f"${w.TOKEN_ENV} to the token the server was started with."
            )
        if status == 413:
            return UserError(f"{where} refused a request as too large ({message}); send smaller batches")
        if status in (404, 405):
            return StoreError(
                f"{where} answered {status} to {response.request.method} {response.request.url.path}: "
                "is this URL an agentbolt store server of a matching version?"
            )
        if status in (502, 503, 504):
            return StoreUnavailableError(f"{where} answered {status}: {message}")
        if 400 <= status < 500:
            return UserError(f"{where} refused the request ({status}): {message}")
        return StoreError(f"{where} answered {status}: {message}")

    # -- operations -------------------------------------------------------------------------------

    async def _dispatch(self, op: Operation, request: BaseModel) -> Any:
        """Send one operation (its validated arguments) to the server; returns its result."""
        if op.waits is not None:
            return await self._wait(op, request)
        call = _Call()
        try:
            return await self._send(op, request, call=call)
        except StaleAttemptError:
            if not call.repeated or op.recover is None:
                raise
            # A try whose answer was lost may have applied: then the report was not stale.
            result = await op.recover(self, request)
            if result is None:
                raise
            log.info("%s: an earlier try whose answer was lost had applied it", op.name)
            return result

    async def _wait(self, op: Operation, request: BaseModel) -> Any:
        """A waiting call as requests of at most ``max_wait_s`` (the server caps each one too),
        until the result ends the wait or the time is up."""
        assert op.waits is not None and op.done is not None
        loop = asyncio.get_running_loop()
        total = getattr(request, op.waits)
        deadline = None if total is None else loop.time() + total
        while True:
            remaining = self._max_wait_s if deadline is None else max(deadline - loop.time(), 0.0)
            chunk = min(remaining, self._max_wait_s)
            result = await self._send(op, request.model_copy(update={op.waits: chunk}), wait_s=chunk)
            if op.done(result) or (deadline is not None and deadline - loop.time() < 0.005):
                return result

    async def _send(self, op: Operation, request: BaseModel, *, wait_s: float = 0.0, call: _Call | None = None) -> Any:
        """One logical call of ``op`` (retried where safe); returns its result."""
        path = op.path
        for name in op.path_params:
            path = _path_param(name).sub(quote(str(getattr(request, name)), safe=""), path)
        body: str | None = None
        params: list[tuple[str, Any]] | None = None
        if op.body is not None:
            body = getattr(request, op.body).model_dump_json()
        elif op.wire_request is not None:
            fields = [n for n in type(request).model_fields if n not in op.path_params]
            if op.method == "POST":
                body = request.model_dump_json(include=set(fields))
            else:
                params = _query(request, fields)
        call = call or _Call()
        content = await self._call(
            op.method,
            path,
            body,
            params=params,
            idempotent=op.idempotent,
            wait_s=wait_s,
            call=call,
            cache_url=not op.path_params,
        )
        if call.repeated and op.lost_answer:
            log.warning("%s was retried after a lost answer: %s", op.name, op.lost_answer)
        return op.read_answer(content)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self._lock:
            clients, self._clients = self._clients, {}
        current = asyncio.get_running_loop()
        for loop, (_, lifetime) in clients.items():
            if loop is current:
                await lifetime.aclose()
            elif loop.is_running():  # another thread's loop: close there
                asyncio.run_coroutine_threadsafe(lifetime.aclose(), loop)


def _path_param(name: str) -> re.Pattern[str]:
    return re.compile(r"{" + name + r"(?::\w+)?}")


def _query(request: BaseModel, fields: list[str]) -> list[tuple[str, Any]]:
    """Query parameters of a ``GET``: the fields that are set, lists as repeated parameters."""
    out: list[tuple[str, Any]] = []
    for name in fields:
        value = getattr(request, name)
        if value is None:
            continue
        for item in value if isinstance(value, list | tuple) else [value]:
            out.append((name, item.value if isinstance(item, enum.Enum) else item))
    return out


async def _lifetime(client: httpx.AsyncClient) -> AsyncGenerator[None, None]:
    try:
        yield
    finally:
        await client.aclose()


def _rebuild(cls: type[AgentboltError], message: str, body: dict[str, Any] | None) -> AgentboltError:
    """An instance of ``cls`` whose message is ``message`` (bypassing custom constructors)."""
    exc = cls.__new__(cls)
    BaseException.__init__(exc, message)
    if isinstance(exc, NotFoundError):
        exc.what = (body or {}).get("what") or ""
        exc.ids = (body or {}).get("ids")
    elif isinstance(exc, errors.PluginError):
        exc.plugin, exc.distribution, exc.detail = "", None, message
    elif isinstance(exc, errors.MissingDependencyError):
        exc.module = exc.package = ""
    return exc
