"""The gateway's HTTP/1.1 client to its upstreams, on asyncio + httptools.

Written by hand for the same reason as the server in :mod:`.http` (that module's docstring has
the measurements): a per-upstream keep-alive pool, TLS, Content-Length or chunked responses
streamed as they arrive (with back-pressure when the gateway's client is slower), connect and
response timeouts, and one transparent retry when a pooled keep-alive connection turns out to be
closed before any byte of the answer arrived.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httptools

__all__ = ["UpstreamError", "UpstreamPool", "UpstreamResponse", "UpstreamTimeout"]


class UpstreamError(Exception):
    """The upstream could not be reached or broke the connection."""


class UpstreamTimeout(UpstreamError):
    """The upstream did not answer in time."""


@dataclass(slots=True)
class UpstreamResponse:
    """An upstream answer; the body streams in as it arrives."""

    status: int
    headers: dict[str, str]
    _conn: _ClientConnection
    _timeout: float
    chunks_read: int = 0
    _finished: bool = field(default=False)

    @property
    def is_stream(self) -> bool:
        return self.headers.get("content-type", "").startswith("text/event-stream")

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        """Body pieces as they arrive (decoded from chunked encoding)."""
        conn = self._conn
        while True:
            if conn.chunks:
                chunk = conn.chunks.popleft()
                if chunk is None:
                    self._finished = True
                    conn.release()
                    return
                self.chunks_read += 1
                conn.resume_if_drained()
                yield chunk
                continue
            if conn.error is not None:
                raise conn.error
            if not await _within(conn.wait_more(), self._timeout):
                conn.abort()
                raise UpstreamTimeout(f"no data from the upstream for {self._timeout:g} s")

    async def read(self) -> bytes:
        """The whole body."""
        return b"".join([chunk async for chunk in self.iter_chunks()])

    def close(self) -> None:
        """Give up on the rest of the body (the connection is not reused)."""
        if not self._finished:
            self._conn.abort()


async def _within(waiter: asyncio.Future[None], timeout: float) -> bool:
    """Wait for ``waiter``; False (and ``waiter`` cancelled) after ``timeout`` seconds.

    ``asyncio.timeout`` arms one timer that cancels this task, and the task awaits ``waiter``
    itself, so the call resumes on the loop turn after ``waiter`` resolves.
    ``asyncio.wait_for`` (before Python 3.12) wraps the wait in another future, and every
    layer costs one more turn of the event loop on each upstream answer's path: under load a
    turn is the time the loop takes to serve every other call that is ready
    (tests/core/test_gateway_timers.py counts the turns). Cancelling the caller stays a
    cancellation, not a timeout.
    """
    try:
        async with asyncio.timeout(timeout):
            await waiter
    except TimeoutError:
        return False
    return True


class _ClientConnection(asyncio.Protocol):
    def __init__(self, pool: UpstreamPool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.headers: dict[str, str] = {}
        self.head: asyncio.Future[None] | None = None
        self.chunks: collections.deque[bytes | None] = collections.deque()
        self._more: asyncio.Future[None] | None = None
        """What :meth:`wait_more` returned, resolved when a chunk, the end or an error arrives."""
        self.error: Exception | None = None
        self.closed = False
        self.received_any = False
        self.keep_alive = True
        self.paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream connection's transport is a full Transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool._discard(self)
        err = UpstreamError(f"connection to {self.pool.base_url} closed{f': {exc}' if exc else ''}")
        if self.head is not None and not self.head.done():
            self.head.set_exception(err)
        elif self.chunks and self.chunks[-1] is None:
            return
        else:
            self.error = err
            self._wake()

    def data_received(self, data: bytes) -> None:
        self.received_any = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.error = UpstreamError(f"malformed HTTP response from {self.pool.base_url}: {exc}")
            if self.head is not None and not self.head.done():
                self.head.set_exception(self.error)
            self._wake()
            self.abort()

    # parser callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.keep_alive = self.parser.should_keep_alive()
        if self.head is not None and not self.head.done():
            self.head.set_result(None)

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self._wake()
        if len(self.chunks) > 64 and self.transport is not None and not self.paused:
            self.paused = True
            self.transport.pause_reading()  # the client end is slower: apply back-pressure

    def on_message_complete(self) -> None:
        self.chunks.append(None)
        self._wake()

    def wait_more(self) -> asyncio.Future[None]:
        """A future resolved when the next chunk, the end of the body or an error arrives."""
        self._more = asyncio.get_running_loop().create_future()
        return self._more

    def _wake(self) -> None:
        more = self._more
        if more is not None:
            self._more = None
            if not more.done():
                more.set_result(None)

    def resume_if_drained(self) -> None:
        if self.paused and len(self.chunks) < 16 and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()

    # request cycle
    def send(self, data: bytes) -> asyncio.Future[None]:
        self.headers = {}
        self.chunks.clear()
        self.error = None
        self.received_any = False
        self.parser = httptools.HttpResponseParser(self)
        self.head = asyncio.get_running_loop().create_future()
        assert self.transport is not None
        self.transport.write(data)
        return self.head

    def release(self) -> None:
        if self.keep_alive and not self.closed and self.error is None:
            self.pool._release(self)
        else:
            self.abort()

    def abort(self) -> None:
        if not self.closed and self.transport is not None:
            self.closed = True
            self.transport.close()
        self.pool._discard(self)


class UpstreamPool:
    """Keep-alive connections to one upstream (``http(s)://host:port``)."""

    def __init__(
        self,
        base_url: str,
        *,
        max_idle: int = 256,
        connect_timeout_s: float = 10.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"upstream URL must be http(s)://host[:port][/prefix], got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.prefix = parts.path.rstrip("/")
        self.ssl = (ssl_context or ssl.create_default_context()) if parts.scheme == "https" else None
        self.host_header = parts.netloc
        self.max_idle = max_idle
        self.connect_timeout_s = connect_timeout_s
        self._idle: list[_ClientConnection] = []
        self.closed = False

    def _release(self, conn: _ClientConnection) -> None:
        if not self.closed and len(self._idle) < self.max_idle:
            self._idle.append(conn)
        else:
            conn.abort()

    def _discard(self, conn: _ClientConnection) -> None:
        try:
            self._idle.remove(conn)
        except ValueError:
            pass

    async def _connect(self) -> _ClientConnection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: _ClientConnection(self), self.host, self.port, ssl=self.ssl),
                self.connect_timeout_s,
            )
        except TimeoutError:
            raise UpstreamTimeout(f"connecting to {self.base_url} took over {self.connect_timeout_s:g} s") from None
        except OSError as exc:
            raise UpstreamError(f"cannot connect to {self.base_url}: {exc}") from exc
        return conn

    async def request(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        headers: list[tuple[str, str]] | None = None,
        *,
        timeout_s: float = 600.0,
    ) -> UpstreamResponse:
        """Send a request; returns once the response headers arrived."""
        lines = [f"{method} {self.prefix}{path} HTTP/1.1", f"host: {self.host_header}"]
        lines += [f"{k}: {v}" for k, v in headers or ()]
        lines.append(f"content-length: {len(body)}")
        data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
        for attempt in range(2):
            reused = bool(self._idle)
            conn = self._idle.pop() if reused else await self._connect()
            if conn.closed:
                continue
            try:
                answered = await _within(conn.send(data), timeout_s)
            except UpstreamError:
                conn.abort()
                # A keep-alive connection the server already closed: retry once on a new one.
                if reused and not conn.received_any and attempt == 0:
                    continue
                raise
            if not answered:
                conn.abort()
                raise UpstreamTimeout(f"{self.base_url} sent no response headers within {timeout_s:g} s")
            return UpstreamResponse(conn.parser.get_status_code(), conn.headers, conn, timeout_s)
        raise UpstreamError(f"cannot send to {self.base_url}")

    def close(self) -> None:
        """Close idle connections; connections still in use close when their call ends."""
        self.closed = True
        for conn in list(self._idle):
            conn.abort()
        self._idle.clear()
