"""The gateway's HTTP server and upstream client keep their deadlines with cheaper timers: one
lazily armed watchdog per server connection (idle timeout, request deadlines) and a timer on the
upstream's own futures instead of ``asyncio.wait_for``. These tests pin the behaviour those
timers must keep: idle connections close after the idle timeout and not before, a trickled
request is cut off, an upstream that stalls mid-body times out, and cancelling a caller is a
cancellation, not a timeout."""

from __future__ import annotations

import asyncio
import gc
import time
import weakref
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from agentbolt.gateway.http import HttpServer, Request, Responder
from agentbolt.gateway.upstream import UpstreamPool, UpstreamTimeout
from agentbolt.long_running_gc import freeze_startup_objects

REQUEST = b"GET /x HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


async def _ok(request: Request, responder: Responder) -> None:
    responder.send(200, b"{}")


@pytest_asyncio.fixture
async def server() -> AsyncIterator[tuple[HttpServer, int]]:
    srv = HttpServer(_ok, idle_timeout_s=0.4, header_timeout_s=0.4, body_timeout_s=0.4)
    port = await srv.start("127.0.0.1", 0)
    yield srv, port
    await srv.stop(grace_s=0.1)


async def _answer(reader: asyncio.StreamReader) -> bytes:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    await asyncio.wait_for(reader.readexactly(2), 5)  # the body, b"{}"
    return head


async def test_an_idle_connection_closes_after_the_idle_timeout(server: tuple[HttpServer, int]) -> None:
    _, port = server
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(REQUEST)
    assert b" 200 " in await _answer(reader)
    answered = time.monotonic()
    assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the server
    waited = time.monotonic() - answered
    assert waited >= 0.35, f"closed {waited:.2f} s after the answer; the idle timeout is 0.4 s"
    writer.close()


async def test_a_busy_connection_outlives_the_idle_timeout(server: tuple[HttpServer, int]) -> None:
    """Each answer starts the idle period anew: requests 0.1 s apart for 1 s keep it open,
    although the watchdog armed on the first idle period fires in between."""
    srv, port = server
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for _ in range(10):
        writer.write(REQUEST)
        assert b" 200 " in await _answer(reader)
        await asyncio.sleep(0.1)
    assert not reader.at_eof()
    connection = next(iter(srv.connections))
    assert connection.idle_since is not None  # idle between requests (what the connection cap uses)
    writer.close()


async def test_a_request_trickling_past_its_deadline_is_cut_off(server: tuple[HttpServer, int]) -> None:
    _, port = server
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(REQUEST[:10])  # the head arrives in pieces, never whole
    await writer.drain()
    started = time.monotonic()
    answer = await asyncio.wait_for(reader.read(), 5)
    assert b" 408 " in answer.split(b"\r\n", 1)[0]
    assert time.monotonic() - started >= 0.3
    writer.close()


async def _stalling_upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answers the head and one chunk, then sends nothing more."""
    await reader.readuntil(b"\r\n\r\n")
    writer.write(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n6\r\ndata: \r\n"
    )
    await writer.drain()
    await asyncio.sleep(30)


@pytest_asyncio.fixture
async def stalling() -> AsyncIterator[UpstreamPool]:
    upstream = await asyncio.start_server(_stalling_upstream, "127.0.0.1", 0)
    pool = UpstreamPool(f"http://127.0.0.1:{upstream.sockets[0].getsockname()[1]}")
    yield pool
    pool.close()
    upstream.close()


async def test_an_upstream_stalling_mid_body_times_out(stalling: UpstreamPool) -> None:
    answer = await stalling.request("POST", "/chat/completions", b"{}", timeout_s=0.3)
    chunks = answer.iter_chunks()
    assert await chunks.__anext__() == b"data: "
    started = time.monotonic()
    with pytest.raises(UpstreamTimeout):
        await chunks.__anext__()
    assert time.monotonic() - started >= 0.25


async def test_cancelling_a_caller_waiting_on_the_upstream_is_a_cancellation(stalling: UpstreamPool) -> None:
    answer = await stalling.request("POST", "/chat/completions", b"{}", timeout_s=30)

    async def read() -> bytes:
        return await answer.read()

    task = asyncio.create_task(read())
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_freezing_startup_objects_keeps_them_out_of_collections() -> None:
    try:
        assert freeze_startup_objects() > 0 and gc.get_freeze_count() > 0
        found = weakref.ref(_Node())  # garbage made afterwards is still collected
        gc.collect()
        assert found() is None
    finally:
        gc.unfreeze()


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the collector frees it
