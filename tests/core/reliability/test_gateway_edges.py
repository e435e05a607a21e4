"""The gateway refuses hijack attempts and slow clients, and treats upstream garbage as a failure."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import httpx
import openai
import pytest
import pytest_asyncio

from agentbolt import types as t
from agentbolt.gateway import UPSTREAM_ERROR, Gateway
from agentbolt.runners.runner import Runner, RunnerConfig
from agentbolt.store import Store, open_store
from agentbolt.testing.bad_upstream import GarbageUpstream

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest_asyncio.fixture
async def gateway() -> AsyncIterator[Gateway]:
    store = open_store("memory://")
    gw = Gateway(store, [], header_timeout_s=0.5, body_timeout_s=0.5, max_connections_per_client=4)
    await gw.start()
    yield gw
    await gw.stop()
    await store.close()


# -- hijack -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["evil.example", "attacker.test:4800", "10.0.0.1", "localhost.evil.example"])
async def test_tokenless_gateway_refuses_other_host_names(gateway: Gateway, host: str) -> None:
    async with httpx.AsyncClient(base_url=gateway.url) as http:
        answer = await http.post(
            "/gateway/upstreams", json={"upstreams": [{"base_url": "http://evil/v1"}]}, headers={"host": host}
        )
        assert answer.status_code == 421
        assert (await http.get("/gateway/stats", headers={"host": host})).status_code == 421
    assert gateway.stats()["upstreams"] == []


@pytest.mark.parametrize(
    "content_type", [None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data"]
)
async def test_tokenless_gateway_control_needs_json(gateway: Gateway, content_type: str | None) -> None:
    headers = {"content-type": content_type} if content_type else {}
    body = b'{"upstreams": [{"base_url": "http://evil/v1"}]}'
    async with httpx.AsyncClient(base_url=gateway.url) as http:
        answer = await http.post("/gateway/upstreams", content=body, headers=headers)
        assert answer.status_code == 415
        assert (await http.post("/gateway/pause", content=b"", headers=headers)).status_code == 415
    assert gateway.stats()["upstreams"] == [] and not gateway.paused


async def test_configured_host_is_served() -> None:
    store = open_store("memory://")
    gw = Gateway(store, [], allowed_hosts=["host.docker.internal"])
    await gw.start()
    try:
        async with httpx.AsyncClient(base_url=gw.url) as http:
            answer = await http.get("/gateway/stats", headers={"host": "host.docker.internal:4800"})
            assert answer.status_code == 200
    finally:
        await gw.stop()
        await store.close()


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER", "bEaReR"])
async def test_bearer_scheme_is_case_insensitive(scheme: str) -> None:
    store = open_store("memory://")
    gw = Gateway(store, [], token="s3cret")
    await gw.start()
    try:
        async with httpx.AsyncClient(base_url=gw.url) as http:
            ok = await http.get("/gateway/stats", headers={"authorization": f"{scheme} s3cret"})
            assert ok.status_code == 200
            assert (await http.get("/gateway/stats", headers={"authorization": f"{scheme} wrong"})).status_code == 401
            assert (await http.get("/gateway/stats", headers={"authorization": "Basic s3cret"})).status_code == 401
    finally:
        await gw.stop()
        await store.close()


# -- slow and greedy clients ------------------------------------------------------------------------


async def _closed_within(reader: asyncio.StreamReader, seconds: float) -> bytes:
    return await asyncio.wait_for(reader.read(), seconds)


async def test_slowloris_headers_are_cut_off(gateway: Gateway) -> None:
    reader, writer = await asyncio.open_connection(gateway.host, gateway.port)
    first = asyncio.ensure_future(reader.read(65536))  # the gateway's answer, when it comes
    started = time.monotonic()
    request = b"GET /gateway/health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 200
    try:
        for byte in request:  # one byte every 50 ms: the idle timer never fires, the deadline does
            if first.done():
                break
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0.05)
    except (ConnectionError, OSError):
        pass
    answer = await asyncio.wait_for(first, 5)
    assert b"408" in answer.split(b"\r\n", 1)[0]
    assert time.monotonic() - started < 5
    writer.close()


async def test_slow_body_is_cut_off(gateway: Gateway) -> None:
    reader, writer = await asyncio.open_connection(gateway.host, gateway.port)
    writer.write(
        b"POST /gateway/pause HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100\r\n\r\n{"
    )
    await writer.drain()
    answer = await _closed_within(reader, 5)
    assert b"408" in answer.split(b"\r\n", 1)[0]
    writer.close()


async def _until(condition: Callable[[], bool]) -> None:
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the gateway never got there")


async def test_over_the_cap_a_clients_longest_idle_connection_makes_room(gateway: Gateway) -> None:
    """An agent that never closes its clients leaves idle keep-alive connections behind: a new
    connection over the cap closes the oldest idle one instead of being refused."""
    connections = gateway._server.connections
    held = []
    for n in range(1, 5):
        held.append(await asyncio.open_connection(gateway.host, gateway.port))
        await _until(lambda n=n: len(connections) == n)  # accepted, in order
    async with httpx.AsyncClient(base_url=gateway.url) as http:  # the 5th: served
        assert (await http.get("/gateway/health")).status_code == 200
    assert await _closed_within(held[0][0], 5) == b""  # the oldest idle one was closed, without an answer
    assert not any(reader.at_eof() for reader, _ in held[1:])
    assert gateway.stats()["idle_connections_evicted"] == 1
    for _, w in held:
        w.close()


async def test_over_the_cap_with_none_idle_the_new_connection_is_refused() -> None:
    store = open_store("memory://")
    gw = Gateway(store, [], header_timeout_s=60, max_connections_per_client=4)
    await gw.start()
    try:
        busy = [await asyncio.open_connection(gw.host, gw.port) for _ in range(4)]
        for _, writer in busy:  # a request arriving on each: none of them is idle
            writer.write(b"GET /gateway/health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            await writer.drain()
        await _until(
            lambda: len(gw._server.connections) == 4 and all(c.idle_since is None for c in gw._server.connections)
        )
        reader, writer = await asyncio.open_connection(gw.host, gw.port)
        answer = await _closed_within(reader, 5)
        assert b"503" in answer.split(b"\r\n", 1)[0]
        writer.close()
        for _, w in busy:
            w.close()
        await _until(lambda: not gw._server.connections)
        async with httpx.AsyncClient(base_url=gw.url) as http:  # freed slots are usable again
            assert (await http.get("/gateway/health")).status_code == 200
    finally:
        await gw.stop()
        await store.close()


async def test_oversized_headers_are_refused(gateway: Gateway) -> None:
    async with httpx.AsyncClient(base_url=gateway.url) as http:
        answer = await http.get("/gateway/health", headers={"x-big": "a" * (70 << 10)})
    assert answer.status_code == 431


# -- upstream garbage -------------------------------------------------------------------------------


@pytest_asyncio.fixture
async def setup() -> AsyncIterator[tuple[Store, GarbageUpstream, Gateway]]:
    store = open_store("memory://")
    upstream = GarbageUpstream()
    await upstream.start()
    gw = Gateway(store, [upstream.base_url], request_timeout_s=1.0, attempt_ttl_s=0)
    await gw.start()
    yield store, upstream, gw
    await gw.stop()
    await upstream.stop()
    await store.close()


@pytest.mark.parametrize(
    ("mode", "stream"),
    [
        ("not_json", False),
        ("wrong_shape", False),
        ("error_200", False),
        ("status_500", False),
        ("slow", False),
        ("reset", True),
        ("no_done", True),
        ("reset_body", False),
    ],
)
async def test_upstream_garbage_is_an_openai_style_upstream_error(
    setup: tuple[Store, GarbageUpstream, Gateway], mode: str, stream: bool
) -> None:
    store, upstream, gw = setup
    upstream.mode = mode
    await store.enqueue([t.RolloutSpec(rollout_id="r")])
    (claim,) = await store.dequeue("w")
    client = openai.AsyncOpenAI(base_url=gw.base_url_for("r", claim.attempt.attempt_id), api_key="k", max_retries=0)

    async def call() -> None:
        if stream:
            async for _ in await client.chat.completions.create(model="m", messages=MESSAGES, stream=True):
                pass
        else:
            await client.chat.completions.create(model="m", messages=MESSAGES)

    started = time.monotonic()
    with pytest.raises(openai.APIError) as caught:
        await call()
    assert time.monotonic() - started < 5
    body = caught.value.body
    inner = body.get("error", body) if isinstance(body, dict) else {}
    assert inner.get("type") == UPSTREAM_ERROR, body
    assert gw.stats()["upstream_errors"] == 1


async def _garbage_agent(task: object, resources: t.Resources) -> float:
    assert resources.llm is not None
    client = openai.AsyncOpenAI(base_url=resources.llm.base_url, api_key="k", max_retries=0)
    await client.chat.completions.create(model="m", messages=MESSAGES)
    return 1.0  # never reached: the call fails


@pytest.mark.parametrize("mode", ["not_json", "wrong_shape"])
async def test_upstream_garbage_is_retried_as_infrastructure_never_success(
    setup: tuple[Store, GarbageUpstream, Gateway], mode: str
) -> None:
    store, upstream, gw = setup
    upstream.mode = mode
    await store.add_resources(t.Resources(llm=t.LLMEndpoint(base_url=gw.url + "/v1", model="m")))
    await store.enqueue([t.RolloutSpec(rollout_id="r", max_attempts=2)])
    runner = Runner(_garbage_agent, store, config=RunnerConfig(exit_when_idle_s=0.5, adapters=[]))
    await asyncio.wait_for(runner.run(), 30)
    (final,) = await store.get_rollouts(["r"])
    assert final.status is t.RolloutStatus.FAILED and final.final_reward is None
    assert final.attempt_count == 2  # the first failure was retried
    attempts = await store.get_attempts("r")
    assert all(a.error is not None and a.error.kind is t.ErrorKind.INFRASTRUCTURE for a in attempts)
