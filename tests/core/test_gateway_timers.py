"""The gateway's HTTP server and upstream client keep their deadlines with cheaper timers: one
lazily armed watchdog per server connection (idle timeout, request deadlines) and
``asyncio.timeout`` on the upstream's own futures instead of ``asyncio.wait_for``. These tests pin
the behaviour those timers must keep: idle connections close after the idle timeout and not
before, a trickled request is cut off, an upstream that stalls mid-body times out, cancelling a
caller is a cancellation, not a timeout, and an upstream's answer costs no extra loop turn."""

from __future__ import annotations

import asyncio
import gc
import sys
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import pytest_asyncio

from agentbolt.gateway.http import HttpServer, Request, Responder
from agentbolt.gateway.upstream import UpstreamPool, UpstreamTimeout, _within
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


async def _turns_until_resumed(wait: Callable[[asyncio.Future[None]], Awaitable[object]]) -> int:
    """How many turns of the event loop pass between a future's result and the resumption of a
    task waiting on it through ``wait``."""
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()
    turns, resumed = 0, False

    def tick() -> None:
        nonlocal turns
        if not resumed:
            turns += 1
            loop.call_soon(tick)

    async def caller() -> None:
        nonlocal resumed
        await wait(waiter)
        resumed = True

    task = asyncio.create_task(caller())
    for _ in range(3):
        await asyncio.sleep(0)  # the caller is waiting
    waiter.set_result(None)
    loop.call_soon(tick)
    await task
    return turns


async def test_an_upstream_answer_resumes_its_caller_as_soon_as_a_bare_await_would() -> None:
    """The upstream waits under a timeout at no cost in loop turns: as soon as awaiting the future
    with no timeout at all (Python 3.11's ``asyncio.wait_for`` takes one turn more)."""

    async def bare(waiter: asyncio.Future[None]) -> None:
        await waiter

    baseline = await _turns_until_resumed(bare)
    assert await _turns_until_resumed(lambda w: _within(w, 30)) == baseline
    if sys.version_info < (3, 12):  # the measure tells a wrapped wait apart
        assert await _turns_until_resumed(lambda w: asyncio.wait_for(w, 30)) > baseline


async def test_a_waiter_past_its_timeout_is_cancelled() -> None:
    waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    assert await _within(waiter, 0.05) is False
    assert waiter.cancelled()


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
