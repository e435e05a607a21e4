"""``http://host:port`` and ``https://...``: a client of the store server (``agentbolt store serve``).

Every :class:`~agentbolt.store.Store` method is one HTTP call (two for a recognised retry of
``finish_attempt``), on a pooled ``httpx.AsyncClient`` per event loop, so one store object
serves many coroutines, threads and successive ``asyncio.run`` calls. Store errors come back as
the same exception class with the same message.

Retries (``retries`` times, exponential backoff) happen only where they are safe:

- A request that never reached the server (connection refused, connect timeout, no free
  pooled connection) is retried for every method.
- After a failure that may have reached the server (lost connection, read timeout, or a 503
  from the server or a proxy), only idempotent calls are retried: reads, ``heartbeat``,
  ``cancel``, ``sweep``, ``add_spans`` (idempotent on span ids; the returned count then
  leaves out spans the lost try stored), and ``enqueue`` (made idempotent by generating the
  missing rollout ids here, before sending).
- ``finish_attempt`` is retried too. If the lost try had already applied, the retry gets
  ``StaleAttemptError``; the client then reads the attempt, and if it ended exactly as
  reported, returns the rollout's current state instead of raising.
- ``dequeue`` is retried too. If the lost try had already claimed rollouts, those claims are
  orphaned: nobody heartbeats them, so their leases expire after ``lease_s`` and the store
  marks the attempts ``lost`` and requeues the rollouts (using one of their attempts). A
  warning is logged when this can have happened.
- ``add_resources`` and ``purge`` are not retried once sent (a second try would store another
  version / report a wrong count): they raise :class:`~agentbolt.errors.StoreUnavailableError`.

Blocking calls (``dequeue(wait_s=...)``, ``wait_for_rollouts``) are split into requests of at
most ``max_wait_s`` seconds, which the server also caps, until the caller's timeout.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import ssl
import threading
from collections.abc import AsyncGenerator, Iterable, Sequence
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit, urlunsplit

import httpx
import orjson
from pydantic import BaseModel

from .. import __version__, errors
from .. import types as t
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
from . import lifecycle
from . import wire as w
from .base import check_span_batch, normalize_statuses
from .run_http import HttpRunsMixin

__all__ = ["HttpStore"]

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)

_UNSENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
"""Transport failures that prove the request never reached the server."""
_SERVER_KILLED_KINDS = frozenset({t.ErrorKind.CANCELLED, t.ErrorKind.TIMEOUT, t.ErrorKind.LOST})
"""Error kinds the store itself gives attempts (a worker's own failure report has another)."""


class _Call:
    """How one logical call went: whether a try that may have been applied was repeated."""

    __slots__ = ("repeated",)

    def __init__(self) -> None:
        self.repeated = False


class HttpStore(HttpRunsMixin):
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

    def _url(self, path: str) -> httpx.URL:
        url = self._urls.get(path)
        if url is None:  # parsed once: httpx would merge and re-parse a relative path per request
            url = self._urls[path] = httpx.URL(self.url + path)
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
    ) -> bytes:
        """Send one logical call, retrying where safe; returns the response body."""
        client = await self._client()
        content = body.model_dump_json() if isinstance(body, BaseModel) else body
        url = self._url(path)
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

    async def _post(self, path: str, body: BaseModel, answer: type[M], **kwargs: Any) -> M:
        return answer.model_validate_json(await self._call("POST", path, body, **kwargs))

    async def _get(self, path: str, answer: type[M], params: Any = None) -> M:
        return answer.model_validate_json(await self._call("GET", path, params=params))

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

    # -- rollouts ---------------------------------------------------------------------------------

    async def enqueue(self, specs: Sequence[t.RolloutSpec]) -> list[t.Rollout]:
        # Ids chosen here make a retried request idempotent.
        specs = [s if s.rollout_id else s.model_copy(update={"rollout_id": t.new_id("ro-")}) for s in specs]
        body = w.EnqueueRequest.model_construct(specs=specs)
        return (await self._post("/v1/rollouts", body, w.RolloutsResponse)).rollouts

    async def dequeue(
        self,
        worker_id: str,
        *,
        limit: int = 1,
        lease_s: float = 30.0,
        mode: t.RolloutMode | None = None,
        wait_s: float = 0.0,
        rollout_ids: Sequence[str] | None = None,
    ) -> list[t.Claim]:
        lifecycle.check_claim_args(limit, lease_s)
        wanted = None if rollout_ids is None else list(dict.fromkeys(rollout_ids))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(wait_s, 0.0)
        while True:
            chunk = min(max(deadline - loop.time(), 0.0), self._max_wait_s)
            body = w.DequeueRequest.model_construct(
                worker_id=worker_id, limit=limit, lease_s=lease_s, mode=mode, wait_s=chunk, rollout_ids=wanted
            )
            call = _Call()
            claims = (await self._post("/v1/rollouts/dequeue", body, w.ClaimsResponse, wait_s=chunk, call=call)).claims
            if call.repeated:
                log.warning(
                    "dequeue by %s was retried after a lost answer: rollouts the lost try claimed, if any, "
                    "return to the queue when their %s s leases expire",
                    worker_id,
                    lease_s,
                )
            if claims or deadline - loop.time() < 0.005:
                return claims

    async def heartbeat(self, attempt_ids: Sequence[str], *, lease_s: float = 30.0) -> list[t.Attempt]:
        lifecycle.check_lease(lease_s)
        body = w.HeartbeatRequest.model_construct(attempt_ids=list(attempt_ids), lease_s=lease_s)
        return (await self._post("/v1/attempts/heartbeat", body, w.AttemptsResponse)).attempts

    async def finish_attempt(
        self,
        attempt_id: str,
        status: t.AttemptStatus,
        *,
        reward: float | None = None,
        error: t.ErrorInfo | None = None,
    ) -> t.Rollout:
        status = t.AttemptStatus(status)
        lifecycle.check_reward(reward)
        body = w.FinishRequest.model_construct(attempt_id=attempt_id, status=status, reward=reward, error=error)
        call = _Call()
        try:
            return (await self._post("/v1/attempts/finish", body, w.RolloutResponse, call=call)).rollout
        except StaleAttemptError:
            if not call.repeated:
                raise
            # A try whose answer was lost may have applied: then the attempt ended as reported.
            (attempt,) = await self.heartbeat([attempt_id])  # renews nothing: the attempt has ended
            if not _ended_as_reported(attempt, status, error):
                raise
            log.info("finish_attempt(%s): an earlier try whose answer was lost had applied it", attempt_id)
            (rollout,) = await self.get_rollouts([attempt.rollout_id])
            return rollout

    async def cancel(self, rollout_ids: Sequence[str], *, reason: str = "cancelled by caller") -> list[t.Rollout]:
        body = w.CancelRequest.model_construct(rollout_ids=list(rollout_ids), reason=reason)
        return (await self._post("/v1/rollouts/cancel", body, w.RolloutsResponse)).rollouts

    async def get_rollouts(self, rollout_ids: Sequence[str]) -> list[t.Rollout]:
        body = w.GetRolloutsRequest.model_construct(rollout_ids=list(rollout_ids))
        return (await self._post("/v1/rollouts/get", body, w.RolloutsResponse)).rollouts

    async def get_attempts(self, rollout_id: str) -> list[t.Attempt]:
        path = f"/v1/rollouts/{quote(rollout_id, safe='')}/attempts"
        return (await self._get(path, w.AttemptsResponse)).attempts

    async def query_rollouts(
        self,
        *,
        status: t.RolloutStatus | Iterable[t.RolloutStatus] | None = None,
        mode: t.RolloutMode | None = None,
        group_id: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> t.Page[t.Rollout]:
        lifecycle.check_limit(limit)
        params: list[tuple[str, str | int]] = [("status", s.value) for s in normalize_statuses(status) or ()]
        if mode is not None:
            params.append(("mode", t.RolloutMode(mode).value))
        if group_id is not None:
            params.append(("group_id", group_id))
        if cursor is not None:
            params.append(("cursor", cursor))
        params.append(("limit", limit))
        return await self._get("/v1/rollouts", t.Page[t.Rollout], params)

    async def count_rollouts(self, *, group_id: str | None = None) -> dict[t.RolloutStatus, int]:
        params = None if group_id is None else {"group_id": group_id}
        return (await self._get("/v1/rollouts/counts", w.CountsResponse, params)).counts

    async def wait_for_rollouts(self, rollout_ids: Sequence[str], timeout: float | None = None) -> list[t.Rollout]:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + max(timeout, 0.0)
        ids = list(rollout_ids)
        while True:
            remaining = self._max_wait_s if deadline is None else max(deadline - loop.time(), 0.0)
            chunk = min(remaining, self._max_wait_s)
            body = w.WaitRequest.model_construct(rollout_ids=ids, timeout=chunk)
            answer = await self._post("/v1/rollouts/wait", body, w.WaitResponse, wait_s=chunk)
            if answer.done or (deadline is not None and deadline - loop.time() < 0.005):
                return answer.rollouts

    async def purge(self, *, rollout_ids: Sequence[str] | None = None, older_than_s: float | None = None) -> int:
        lifecycle.check_purge_args(rollout_ids, older_than_s)
        ids = None if rollout_ids is None else list(rollout_ids)
        body = w.PurgeRequest.model_construct(rollout_ids=ids, older_than_s=older_than_s)
        return (await self._post("/v1/rollouts/purge", body, w.PurgeResponse, idempotent=False)).purged

    # -- spans ------------------------------------------------------------------------------------

    async def add_spans(self, spans: Sequence[t.Span]) -> int:
        check_span_batch(spans)
        if not spans:
            return 0
        body = w.AddSpansRequest.model_construct(spans=list(spans))
        return (await self._post("/v1/spans", body, w.AddSpansResponse)).added

    async def query_spans(
        self,
        rollout_ids: Sequence[str],
        *,
        latest_attempt_only: bool = False,
        after_seq: int | None = None,
    ) -> dict[str, list[t.Span]]:
        body = w.QuerySpansRequest.model_construct(
            rollout_ids=list(rollout_ids), latest_attempt_only=latest_attempt_only, after_seq=after_seq
        )
        return (await self._post("/v1/spans/query", body, w.SpansResponse)).spans

    # -- resources --------------------------------------------------------------------------------

    async def add_resources(self, resources: t.Resources) -> t.Resources:
        answer = await self._post("/v1/resources", resources, w.ResourcesResponse, idempotent=False)
        assert answer.resources is not None
        return answer.resources

    async def get_resources(self, version: int | None = None) -> t.Resources | None:
        params = None if version is None else {"version": version}
        return (await self._get("/v1/resources", w.ResourcesResponse, params)).resources

    # -- maintenance ------------------------------------------------------------------------------

    async def sweep(self) -> int:
        return (w.SweepResponse.model_validate_json(await self._call("POST", "/v1/sweep"))).ended

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


async def _lifetime(client: httpx.AsyncClient) -> AsyncGenerator[None, None]:
    try:
        yield
    finally:
        await client.aclose()


def _ended_as_reported(attempt: t.Attempt, status: t.AttemptStatus, error: t.ErrorInfo | None) -> bool:
    """Whether an ended attempt is exactly what the worker's report would have made of it."""
    if attempt.status is not status:
        return False
    if status is t.AttemptStatus.SUCCEEDED:
        return True  # only the worker's report makes an attempt succeed
    if error is not None:
        return attempt.error == error
    return attempt.error is not None and attempt.error.kind not in _SERVER_KILLED_KINDS


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
