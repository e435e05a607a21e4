"""A small HTTP/1.1 server on asyncio + httptools (its upstream client: :mod:`.upstream`).

The gateway sits on the path of every LLM call, so its own cost per request matters, and this
is the one piece of infrastructure written by hand instead of taken from a library, because
``benchmarks/gateway_http_stack.py`` shows the libraries cannot hold the gateway's targets with
the same margin (docs/benchmarks.md, "Why the gateway's HTTP layer is hand-written"). The same
minimal OpenAI proxy, five runs on a shared 2-vCPU machine: the serving process spends 35-43 us
of CPU per call on this server and :mod:`.upstream`'s client, 93-105 us on aiohttp (its server and client, or uvicorn
and its client) and 885-1,295 us on uvicorn + httpx; at one client it adds 0.06-0.11 ms,
0.15-0.22 ms and 0.50-0.58 ms. With a 50 ms backend and 64 concurrent clients (target: p50
<= 1 ms and p99 <= 5 ms added) the medians of the five runs were 0.04 / 4.02 ms here, 2.06 /
3.97 ms on aiohttp, 0.49 / 12.29 ms on uvicorn + aiohttp and 266 / 1,853 ms on uvicorn + httpx.

The two implement only what an OpenAI-compatible proxy needs:

- server: keep-alive, pipelined requests answered in order, request bodies with
  Content-Length or chunked encoding, ``Expect: 100-continue``, header and body size limits,
  idle connection timeout, deadlines for a request's headers and body (a client trickling
  bytes is cut off: slowloris), a cap on connections per client address (its longest-idle
  connection closed first), full responses or
  chunked streams (SSE);
- client (:mod:`.upstream`): per-upstream keep-alive pool, TLS, Content-Length or chunked
  responses streamed as they arrive, connect/response timeouts, one transparent retry when a
  pooled keep-alive connection turns out to be closed before any byte of the answer arrived.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httptools

__all__ = ["HttpServer", "Request", "Responder"]

log = logging.getLogger(__name__)

_REASONS = {
    100: "Continue",
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    408: "Request Timeout",
    405: "Method Not Allowed",
    409: "Conflict",
    413: "Payload Too Large",
    415: "Unsupported Media Type",
    421: "Misdirected Request",
    422: "Unprocessable Content",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


@dataclass(slots=True)
class Request:
    """A parsed HTTP request."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    """Lower-cased header names (the last value wins)."""
    body: bytes


Handler = Callable[[Request, "Responder"], Awaitable[None]]


def _head(status: int, headers: list[tuple[str, str]], extra: str) -> bytes:
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}"]
    lines += [f"{k}: {v}" for k, v in headers]
    lines.append(extra)
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class Responder:
    """Writes one response; responses of pipelined requests leave in request order."""

    __slots__ = ("_close", "_conn", "_streaming", "done", "status")

    def __init__(self, conn: _ServerConnection, close: bool) -> None:
        self._conn = conn
        self._close = close
        self._streaming = False
        self.done = False
        self.status = 0

    @property
    def disconnected(self) -> bool:
        """True once the client went away; further writes are dropped."""
        return self._conn.closed

    def send(self, status: int, body: bytes, headers: list[tuple[str, str]] | None = None) -> None:
        """Send a complete response."""
        hdrs = [("content-type", "application/json"), *(headers or [])]
        conn_header = "connection: close" if self._close else "connection: keep-alive"
        self.status = status
        self._conn.write(_head(status, [*hdrs, ("content-length", str(len(body)))], conn_header) + body)
        self._finish()

    def start_stream(self, status: int, headers: list[tuple[str, str]] | None = None) -> None:
        """Begin a chunked response (e.g. Server-Sent Events)."""
        hdrs = [("content-type", "text/event-stream"), ("cache-control", "no-cache"), *(headers or [])]
        self.status = status
        self._streaming = True
        self._conn.write(_head(status, [*hdrs, ("transfer-encoding", "chunked")], "connection: keep-alive"))

    def write(self, data: bytes) -> None:
        """Send one chunk of a stream."""
        if data:
            self._conn.write(b"%x\r\n%s\r\n" % (len(data), data))

    async def drain(self) -> None:
        """Wait while the client is slower than the upstream (transport back-pressure)."""
        await self._conn.drained()

    def end_stream(self) -> None:
        """Terminate a chunked response."""
        self._conn.write(b"0\r\n\r\n")
        self._finish()

    def _finish(self) -> None:
        self.done = True
        self._conn.response_done(self._close)


class _ServerConnection(asyncio.Protocol):
    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.closed = False
        self.queue: collections.deque[tuple[Request, bool]] = collections.deque()
        self.busy = False
        self._url = b""
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._size = 0
        self._loop = asyncio.get_running_loop()  # protocols are made on the serving loop
        # One watchdog timer per connection, armed lazily: a request that arrives whole in one
        # read and is answered before the connection's idle timeout never creates, moves or
        # cancels a timer (four timer operations per request otherwise, on every call's path).
        self._watchdog: asyncio.TimerHandle | None = None
        self._idle_since: float | None = None
        """Loop time the connection went idle (no request arriving, queued or answered)."""
        self._deadline = 0.0
        """Loop time by which the request being received must have its head (or body)."""
        self._deadline_what = ""
        self._deadline_s = 0.0
        self._header_bytes = 0
        self._in_message = False
        self._peer: str = ""
        self._writable = asyncio.Event()
        self._writable.set()
        self.task: asyncio.Task[None] | None = None

    # -- transport events ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream connection's transport is a full Transport
        self.server.connections.add(self)
        peer = transport.get_extra_info("peername")
        self._peer = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        count = self.server.per_client.get(self._peer, 0) + 1
        self.server.per_client[self._peer] = count
        if count > self.server.max_connections_per_client and not self.server.close_idle_of(self._peer, but=self):
            log.warning("refusing a connection from %s: it holds %d already, none idle", self._peer, count - 1)
            self._fail(503, f"too many connections from {self._peer or 'this client'}; reuse connections")
            return
        self._go_idle()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self in self.server.connections:
            self.server.connections.discard(self)
            left = self.server.per_client.get(self._peer, 1) - 1
            if left > 0:
                self.server.per_client[self._peer] = left
            else:
                self.server.per_client.pop(self._peer, None)
        self._writable.set()
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(400, "protocol upgrades are not supported")
        except httptools.HttpParserError as exc:
            self._fail(400, f"malformed HTTP request: {exc}")
        if self._in_message and not self.closed:  # a request still arriving: its deadline must be watched
            self._watch(self._deadline)

    # -- parser callbacks ----------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._in_message = True
        self._url = b""
        self._headers = {}
        self._body = []
        self._size = 0
        self._header_bytes = 0
        self._idle_since = None
        # The whole head must arrive within the deadline, however slowly it trickles in.
        self._set_deadline(self.server.header_timeout_s, "request headers")

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._count_header_bytes(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_header_bytes(len(name) + len(value))
        if len(self._headers) >= self.server.max_headers:
            self._fail(431, f"more than {self.server.max_headers} request headers")
            return
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self._set_deadline(self.server.body_timeout_s, "the request body")
        if self._headers.get("expect", "").lower() == "100-continue":
            self.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def _count_header_bytes(self, n: int) -> None:
        self._header_bytes += n
        if self._header_bytes > self.server.max_header_bytes:
            self._fail(431, f"request line and headers over {self.server.max_header_bytes} bytes")

    def _set_deadline(self, seconds: float, what: str) -> None:
        """The part of the request now arriving (``what``) must be in within ``seconds``: checked
        by the watchdog, armed only if the request is still incomplete after this read."""
        self._deadline = self._loop.time() + seconds
        self._deadline_what = what
        self._deadline_s = seconds

    def _watch(self, when: float) -> None:
        """Have the watchdog fire by loop time ``when`` (it may fire earlier: it checks)."""
        watchdog = self._watchdog
        if watchdog is not None:
            if watchdog.when() <= when:
                return
            watchdog.cancel()
        self._watchdog = self._loop.call_at(when, self._check)

    def _check(self) -> None:
        """The watchdog: cut a request that is too slow, close a connection idle too long;
        else re-arm for the next moment either could happen."""
        self._watchdog = None
        if self.closed:
            return
        now = self._loop.time()
        if self._in_message:
            if now >= self._deadline:
                what, seconds = self._deadline_what, self._deadline_s
                log.info("closing a connection from %s: %s did not arrive within %g s", self._peer, what, seconds)
                self._fail(408, f"{what} did not arrive within {seconds:g} s")
            else:
                self._watch(self._deadline)
        elif self._idle_since is not None:
            closes = self._idle_since + self.server.idle_timeout_s
            if now >= closes:
                self.close()
            else:
                self._watch(closes)

    def on_body(self, body: bytes) -> None:
        self._size += len(body)
        if self._size > self.server.max_body:
            self._fail(413, f"request body over {self.server.max_body} bytes")
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._in_message = False  # a watchdog armed for its deadline finds nothing to do
        if self.closed:
            return
        parsed = httptools.parse_url(self._url)
        request = Request(
            method=self.parser.get_method().decode("latin-1"),
            path=(parsed.path or b"/").decode("latin-1"),
            query=(parsed.query or b"").decode("latin-1"),
            headers=self._headers,
            body=b"".join(self._body),
        )
        self.queue.append((request, not self.parser.should_keep_alive()))
        if not self.busy:
            self._next()

    # -- request handling ----------------------------------------------------------------------

    def _next(self) -> None:
        if not self.queue or self.closed:
            self.busy = False
            self._go_idle()
            return
        self.busy = True
        request, close = self.queue.popleft()
        self.task = asyncio.get_running_loop().create_task(self._run(request, Responder(self, close)))

    async def _run(self, request: Request, responder: Responder) -> None:
        try:
            await self.server.handler(request, responder)
        except Exception:
            log.exception("gateway handler failed for %s %s", request.method, request.path)
            if not responder.done and not responder._streaming:
                responder.send(500, b'{"error":{"message":"internal gateway error","type":"agentbolt_gateway_error"}}')
        finally:
            if not responder.done:
                if responder._streaming:
                    self.close()  # a stream cut short cannot be terminated cleanly
                else:
                    responder.send(500, b'{"error":{"message":"no response","type":"agentbolt_gateway_error"}}')

    def response_done(self, close: bool) -> None:
        if close:
            self.close()
        else:
            self._next()

    def write(self, data: bytes) -> None:
        if not self.closed and self.transport is not None:
            self.transport.write(data)

    async def drained(self) -> None:
        await self._writable.wait()

    def close(self) -> None:
        if not self.closed and self.transport is not None:
            self.closed = True
            self.transport.close()

    def _fail(self, status: int, message: str) -> None:
        if self.closed:
            return
        body = json.dumps({"error": {"message": message, "type": "invalid_request_error"}}).encode()
        self.write(
            _head(
                status, [("content-type", "application/json"), ("content-length", str(len(body)))], "connection: close"
            )
            + body
        )
        self.close()

    def _go_idle(self) -> None:
        """No request in progress: the connection closes once idle for ``idle_timeout_s``."""
        if self.closed or self._in_message:
            return
        self._idle_since = now = self._loop.time()
        self._watch(now + self.server.idle_timeout_s)

    @property
    def idle_since(self) -> float | None:
        """When this keep-alive connection went idle (loop time), None while it has a request in
        progress (arriving, queued or being answered) or once closed."""
        if self.closed or self._idle_since is None or self.busy or self.queue or self._in_message:
            return None
        return self._idle_since


class HttpServer:
    """Serves ``handler(request, responder)`` on a TCP port.

    Args:
        handler: called once per request.
        max_body: largest request body in bytes (413 beyond).
        max_header_bytes, max_headers: limits of the request line and headers (431 beyond).
        idle_timeout_s: a keep-alive connection with no request in progress closes after this.
        header_timeout_s: a request's line and headers must all arrive within this (408).
        body_timeout_s: a request's body must arrive within this after its headers (408).
        max_connections_per_client: connections one client address may hold open; over it, the
            client's longest-idle connection is closed, or the new one refused (503) when none is idle.
    """

    def __init__(
        self,
        handler: Handler,
        *,
        max_body: int = 64 << 20,
        max_header_bytes: int = 64 << 10,
        max_headers: int = 100,
        idle_timeout_s: float = 75.0,
        header_timeout_s: float = 10.0,
        body_timeout_s: float = 60.0,
        max_connections_per_client: int = 256,
    ) -> None:
        self.handler = handler
        self.max_body = max_body
        self.max_header_bytes = max_header_bytes
        self.max_headers = max_headers
        self.idle_timeout_s = idle_timeout_s
        self.header_timeout_s = header_timeout_s
        self.body_timeout_s = body_timeout_s
        self.max_connections_per_client = max_connections_per_client
        self.per_client: dict[str, int] = {}
        self.connections: set[_ServerConnection] = set()
        self.evicted = 0
        """Idle connections closed to make room for a client's new one over the cap."""
        self._server: asyncio.base_events.Server | None = None

    def close_idle_of(self, peer: str, *, but: _ServerConnection) -> bool:
        """Close the longest-idle keep-alive connection of ``peer`` (other than ``but``); False if
        it has none idle.

        An agent that makes a client per rollout and never closes it (the quickstart agent does)
        leaves its connection open until the garbage collector finds the client, which can take
        minutes: at a few rollouts per second its idle connections alone pass the cap. Closing an
        idle keep-alive connection is allowed at any time (RFC 9112, 9.6), so a client over the
        cap loses its oldest idle connection instead of getting a 503 for the new one.
        """
        idle = [
            (since, c)
            for c in self.connections
            if c is not but and c._peer == peer and (since := c.idle_since) is not None
        ]
        if not idle:
            return False
        _, oldest = min(idle, key=lambda pair: pair[0])
        log.debug(
            "closing the longest-idle connection from %s: it is over %d connections",
            peer,
            self.max_connections_per_client,
        )
        oldest.close()
        self.evicted += 1
        return True

    async def start(self, host: str, port: int) -> int:
        """Listen; returns the bound port (useful with port 0)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _ServerConnection(self), host, port, reuse_address=True)
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop accepting, let running requests finish for ``grace_s``, then close everything."""
        if self._server is None:
            return
        self._server.close()
        tasks = [c.task for c in self.connections if c.task is not None and not c.task.done()]
        if tasks:
            await asyncio.wait(tasks, timeout=grace_s)
        for conn in list(self.connections):
            conn.close()
        await self._server.wait_closed()
        self._server = None
