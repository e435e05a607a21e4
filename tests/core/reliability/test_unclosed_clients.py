"""An agent's dropped, never-closed OpenAI client must not leave a later model call unanswered.

The K = 2 stall of docs/benchmarks.md: the garbage collector, running on another thread (the
gateway's, the trainer's), finalizes a dropped ``AsyncOpenAI``: its connection's transport closes
the socket, and openai's ``__del__`` schedules ``aclose()`` on that thread's event loop. The agent
loop's next connection gets the same descriptor number; the late ``aclose()`` removed *its*
reader, so its answer was never read (https://github.com/python/cpython/issues/130141). This test
plays that sequence step by step on the runner's agent loop (:class:`AgentWorkers`).
"""

from __future__ import annotations

import asyncio
import gc
import selectors
import socket
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from agentbolt.runners.agent_loop import new_agent_loop
from agentbolt.runners.workers import AgentWorkers
from agentbolt.testing.fake_llm import FakeLLM, FakeLLMServer

WAIT_S = 15.0
"""Bounds every wait so that a regression fails the test instead of hanging it."""


@pytest.fixture
def other_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """Another thread's running event loop (as the gateway's is in the in-process runner)."""
    loop = new_agent_loop()
    thread = threading.Thread(target=loop.run_forever, name="other-loop", daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(WAIT_S)
    loop.close()


@pytest.fixture
def collector_off() -> Iterator[None]:
    """Garbage is collected only where the test says (the default collector could run anywhere)."""
    was_enabled = gc.isenabled()
    gc.collect()  # earlier tests' garbage goes now, not in the collection the test makes
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _connection_fd(client: openai.AsyncOpenAI) -> int:
    """The socket descriptor of the client's one pooled connection."""
    (connection,) = client._client._transport._pool.connections  # type: ignore[attr-defined]
    return int(connection._connection._network_stream.get_extra_info("socket").fileno())


def _next_socket_gets(fd: int) -> list[socket.socket]:
    """Make ``fd`` the lowest free descriptor (so the next socket gets it) by holding every
    lower free one; returns the placeholders, to close afterwards."""
    held = []
    while True:
        placeholder = socket.socket()
        if placeholder.fileno() >= fd:
            placeholder.close()
            return held
        held.append(placeholder)


async def _settle() -> None:
    """Return once every other task of the running loop has finished."""
    me = asyncio.current_task()
    for _ in range(10_000):
        if not [task for task in asyncio.all_tasks() if task is not me]:
            return
        await asyncio.sleep(0)
    raise AssertionError("the other loop's tasks did not finish")


@pytest.mark.usefixtures("collector_off")
async def test_a_client_collected_on_another_loop_does_not_stall_the_next_call_on_its_descriptor(
    other_loop: asyncio.AbstractEventLoop,
) -> None:
    arrived, answer = threading.Event(), threading.Event()
    requests: list[Any] = []

    def reply(request: Any) -> str:  # the fake server's thread: hold the second answer until told
        requests.append(request)
        if len(requests) == 2:
            arrived.set()
            answer.wait(WAIT_S)
        return "42"

    with FakeLLMServer(FakeLLM(default_reply=reply)) as server:
        workers = AgentWorkers("test-agent")
        message = [{"role": "user", "content": "6 * 7?"}]
        dropped: list[weakref.ref[openai.AsyncOpenAI]] = []

        async def first_rollout() -> int:  # the quickstart agent's way: a client per rollout, never closed
            client = openai.AsyncOpenAI(base_url=server.base_url, api_key="none", max_retries=0)
            await client.chat.completions.create(model="m", messages=message)  # type: ignore[arg-type]
            dropped.append(weakref.ref(client))
            return _connection_fd(client)

        first_fd = await workers.call_async(first_rollout)
        assert dropped[0]() is not None  # only the collector can free it (its objects form cycles)

        # The collection runs on the other loop's thread, and that loop is held until the next
        # call waits for its answer: the openai client's aclose() is scheduled there, not yet run.
        collected, release = threading.Event(), threading.Event()

        def collect() -> None:
            gc.collect()
            collected.set()
            release.wait(WAIT_S)

        other_loop.call_soon_threadsafe(collect)
        assert collected.wait(WAIT_S)
        placeholders = _next_socket_gets(first_fd)  # the collection may have freed lower descriptors too

        async def second_rollout() -> str | None:
            client = openai.AsyncOpenAI(base_url=server.base_url, api_key="none", max_retries=0, timeout=WAIT_S)
            call = asyncio.ensure_future(client.chat.completions.create(model="m", messages=message))  # type: ignore[arg-type]
            await asyncio.get_running_loop().run_in_executor(None, arrived.wait, WAIT_S)
            fd = _connection_fd(client)
            assert fd == first_fd, "precondition: the new connection reuses the collected one's descriptor"
            selector: selectors.BaseSelector = asyncio.get_running_loop()._selector  # type: ignore[attr-defined]
            for _ in range(10_000):  # until the client waits for the answer (its reader registered)
                key = selector.get_map().get(fd)
                if key is not None and key.events & selectors.EVENT_READ:
                    break
                await asyncio.sleep(0)
            else:
                raise AssertionError("the client never waited for its answer")
            release.set()  # the other loop runs the dropped client's aclose() now ...
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(_settle(), other_loop))
            answer.set()  # ... and only then does the answer come
            reply = await call
            await client.close()
            return reply.choices[0].message.content

        try:
            assert await asyncio.wait_for(workers.call_async(second_rollout), WAIT_S + 5) == "42"
        finally:
            release.set()
            answer.set()
            workers.close()
            for placeholder in placeholders:
                placeholder.close()


class _Owner:
    """Owns a transport and, like openai's client, closes it late when it is collected."""

    def __init__(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.cycle = self

    def __del__(self) -> None:
        _late_closes.append(self.transport)


_late_closes: list[asyncio.BaseTransport] = []


@pytest.mark.usefixtures("collector_off")
def test_a_transport_finalized_unclosed_on_the_agent_loop_leaves_its_reused_descriptor_alone() -> None:
    """The same bug without openai: a late close() of a finalized transport must be a no-op."""
    loop = new_agent_loop()

    async def scenario() -> bool:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        old, _ = await loop.create_connection(asyncio.Protocol, "127.0.0.1", port)
        old_fd = old.get_extra_info("socket").fileno()
        old.pause_reading()  # idle, as a pooled keep-alive connection is (anyio pauses between reads)
        _Owner(old)
        del old
        gc.collect()  # finalizes the transport (closing its socket) and resurrects it in _late_closes
        placeholders = _next_socket_gets(old_fd)
        new, _ = await loop.create_connection(asyncio.Protocol, "127.0.0.1", port)
        for placeholder in placeholders:
            placeholder.close()
        assert new.get_extra_info("socket").fileno() == old_fd, "precondition: the descriptor is reused"
        await asyncio.sleep(0)  # the new transport registers its reader
        _late_closes.pop().abort()  # the owner's late close
        still_reading = old_fd in loop._selector.get_map()  # type: ignore[attr-defined]
        new.close()
        server.close()
        await server.wait_closed()
        return still_reading

    try:
        assert loop.run_until_complete(scenario())
    finally:
        loop.close()
