"""The gateway's HTTP layer against libraries: one minimal OpenAI proxy on several HTTP stacks.

Run:  uv run python benchmarks/gateway_http_stack.py [--requests 2000] [--repeat 3] [--stacks ...]

The gateway (``agentbolt.gateway``) serves and forwards on its own HTTP/1.1 server and upstream
client (``agentbolt.gateway.http`` and ``.upstream``: asyncio + httptools). This benchmark asks whether a
well-kept library would do as well: the SAME minimal OpenAI-style proxy is built on each stack,

- ``agentbolt``: ``gateway.http.HttpServer`` + ``gateway.upstream.UpstreamPool`` (what the gateway runs on);
- ``uvicorn+httpx``: uvicorn (httptools parser, uvloop) + a raw ASGI app + ``httpx.AsyncClient``;
- ``aiohttp``: aiohttp's web server + ``aiohttp.ClientSession`` (on uvloop);
- ``uvicorn+aiohttp``: uvicorn (httptools, uvloop) + a raw ASGI app + ``aiohttp.ClientSession``;
- ``gateway``: for reference, the real gateway (``agentbolt gateway serve``: routing by
  rollout, request rewriting, upstream checks, one span per call written to SQLite).

Each proxy takes ``POST /v1/chat/completions``, parses the JSON body and serializes it again
(the gateway rewrites requests), forwards it to the fake OpenAI backend, and relays the answer:
non-streaming answers are read whole and parsed (the gateway checks them) before they are sent
on; SSE streams are relayed chunk by chunk as they arrive. Every proxy runs in its own process
on uvloop, with keep-alive upstream connections and no access log.

Measured as ``benchmarks/gateway.py`` measures the gateway (its load generator: a closed loop
of C concurrent clients on keep-alive connections): added latency = the percentile through the
proxy minus the same percentile calling the backend directly, medians over ``--repeat``
rounds; in each round the direct measurement and then every stack run back to back, in an order
that rotates between rounds. Rows: a 0 ms backend at concurrency 1 and 64 (added p50 and
requests/s through the proxy), a 50 ms backend at 64 concurrent (added p50 / p99: the
gateway's target is p50 <= 1 ms and p99 <= 5 ms there), and SSE streams (the backend sends a
chunk every 2 ms) at concurrency 1 and 64: added time to the first chunk, p50. ``CPU/req`` is
the CPU time (user + system) of the serving process per request at 0 ms, 64 concurrent (for
``direct``: the backend's): the proxy's own cost, which the load of a shared machine disturbs
far less than it disturbs latencies. The 50 ms rows are also printed per round, to show their
spread.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import psutil

ROWS = [
    ("0ms c1", 0.0, 1, False),
    ("0ms c64", 0.0, 64, False),
    ("stream c1", 0.0, 1, True),
    ("stream c64", 0.0, 64, True),
    ("50ms c64", 50.0, 64, False),
]
"""(row, backend latency in ms, concurrency, streaming?)"""
STACKS = ["agentbolt", "uvicorn+httpx", "aiohttp", "uvicorn+aiohttp", "gateway"]
TIMEOUT_S = 60.0
STREAM_BODY = orjson.dumps(
    {
        "model": "fake-model",
        "messages": [{"role": "user", "content": "What is 6 times 7?"}],
        "max_tokens": 16,
        "stream": True,
    }
)
NOT_FOUND = b'{"error":{"message":"not found","type":"invalid_request_error"}}'


# ------------------------------------------------------------------------------------------------
# The proxy logic every stack shares
# ------------------------------------------------------------------------------------------------


def prepare(body: bytes) -> tuple[bytes, bool]:
    """Parse the client's request and serialize it again; returns (upstream body, stream?)."""
    request = orjson.loads(body)
    return orjson.dumps(request), bool(request.get("stream"))


def check(answer: bytes) -> None:
    """Parse a non-streaming answer (the gateway checks what it relays)."""
    orjson.loads(answer)


def serve_agentbolt(upstream: str, port: int) -> None:
    from agentbolt.gateway.http import HttpServer, Request, Responder
    from agentbolt.gateway.upstream import UpstreamPool

    async def main() -> None:
        pool = UpstreamPool(upstream, max_idle=512)

        async def handler(request: Request, responder: Responder) -> None:
            if request.method != "POST" or request.path != "/v1/chat/completions":
                responder.send(404, NOT_FOUND)
                return
            body, stream = prepare(request.body)
            headers = [("content-type", "application/json")]
            answer = await pool.request("POST", "/chat/completions", body, headers, timeout_s=TIMEOUT_S)
            if stream and answer.is_stream:
                responder.start_stream(answer.status)
                async for chunk in answer.iter_chunks():
                    responder.write(chunk)
                    await responder.drain()
                responder.end_stream()
            else:
                data = await answer.read()
                check(data)
                responder.send(answer.status, data)

        server = HttpServer(handler, max_connections_per_client=1024)
        await server.start("127.0.0.1", port)
        await until_sigterm()
        await server.stop()
        pool.close()

    run_loop(main())


def asgi_app(make_client: Callable[[], Any], forward: Callable[..., Any]) -> Callable[..., Any]:
    """A raw ASGI app: the proxy logic with the upstream client ``make_client()`` (made at startup)."""
    state: dict[str, Any] = {}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    state["client"] = make_client()
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    client = state["client"]
                    await (client.aclose() if hasattr(client, "aclose") else client.close())
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["method"] != "POST" or scope["path"] != "/v1/chat/completions":
            await send_full(send, 404, NOT_FOUND)
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body, stream = prepare(b"".join(chunks))
        await forward(state["client"], body, stream, send)

    return app


async def send_full(send: Any, status: int, data: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


def serve_uvicorn(upstream: str, port: int, client: str) -> None:
    import uvicorn

    url = upstream + "/chat/completions"
    headers = {"content-type": "application/json"}
    if client == "httpx":
        import httpx

        def make_client() -> Any:
            limits = httpx.Limits(max_connections=512, max_keepalive_connections=512)
            return httpx.AsyncClient(limits=limits, timeout=TIMEOUT_S)

        async def forward(client: Any, body: bytes, stream: bool, send: Any) -> None:
            if stream:
                async with client.stream("POST", url, content=body, headers=headers) as answer:
                    await send({"type": "http.response.start", "status": answer.status_code, "headers": SSE_HEADERS})
                    async for chunk in answer.aiter_raw():
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b""})
            else:
                answer = await client.post(url, content=body, headers=headers)
                check(answer.content)
                await send_full(send, answer.status_code, answer.content)

    else:
        import aiohttp

        def make_client() -> Any:
            connector = aiohttp.TCPConnector(limit=512)
            return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=TIMEOUT_S))

        async def forward(client: Any, body: bytes, stream: bool, send: Any) -> None:
            async with client.post(url, data=body, headers=headers) as answer:
                if stream:
                    await send({"type": "http.response.start", "status": answer.status, "headers": SSE_HEADERS})
                    async for chunk in answer.content.iter_any():
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    await send({"type": "http.response.body", "body": b""})
                else:
                    data = await answer.read()
                    check(data)
                    await send_full(send, answer.status, data)

    uvicorn.run(
        asgi_app(make_client, forward),
        host="127.0.0.1",
        port=port,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        access_log=False,
        log_level="warning",
        timeout_keep_alive=75,
    )


def serve_aiohttp(upstream: str, port: int) -> None:
    import aiohttp
    from aiohttp import web

    url = upstream + "/chat/completions"
    headers = {"content-type": "application/json"}

    async def main() -> None:
        connector = aiohttp.TCPConnector(limit=512)
        session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=TIMEOUT_S))

        async def handle(request: web.Request) -> web.StreamResponse:
            body, stream = prepare(await request.read())
            async with session.post(url, data=body, headers=headers) as answer:
                if stream:
                    response = web.StreamResponse(
                        status=answer.status, headers={"content-type": "text/event-stream", "cache-control": "no-cache"}
                    )
                    await response.prepare(request)
                    async for chunk in answer.content.iter_any():
                        await response.write(chunk)
                    await response.write_eof()
                    return response
                data = await answer.read()
                check(data)
                return web.Response(status=answer.status, body=data, content_type="application/json")

        app = web.Application()
        app.router.add_post("/v1/chat/completions", handle)
        runner = web.AppRunner(app, access_log=None, keepalive_timeout=75)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        await until_sigterm()
        await runner.cleanup()
        await session.close()

    run_loop(main())


async def until_sigterm() -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()


def run_loop(main: Any) -> None:
    import uvloop

    uvloop.run(main)


def serve(stack: str, upstream: str, port: int) -> None:
    if stack == "agentbolt":
        serve_agentbolt(upstream, port)
    elif stack == "uvicorn+httpx":
        serve_uvicorn(upstream, port, "httpx")
    elif stack == "uvicorn+aiohttp":
        serve_uvicorn(upstream, port, "aiohttp")
    elif stack == "aiohttp":
        serve_aiohttp(upstream, port)
    else:
        raise SystemExit(f"unknown stack {stack!r}; choose from {STACKS}")


# ------------------------------------------------------------------------------------------------
# Load generation (benchmarks/gateway.py's closed loop, plus a streaming variant)
# ------------------------------------------------------------------------------------------------


async def load_stream(base_urls: list[str], n: int, concurrency: int) -> list[float]:
    """Streaming requests in a closed loop; returns the times to the first body chunk."""
    from agentbolt.gateway.upstream import UpstreamPool

    pools = {url: UpstreamPool(url, max_idle=512) for url in set(base_urls)}
    headers = [("content-type", "application/json")]
    firsts: list[float] = []
    remaining = n

    async def worker(k: int) -> None:
        nonlocal remaining
        pool = pools[base_urls[k % len(base_urls)]]
        while remaining > 0:
            remaining -= 1
            start = time.perf_counter()
            answer = await pool.request("POST", "/chat/completions", STREAM_BODY, headers, timeout_s=TIMEOUT_S)
            first = None
            async for chunk in answer.iter_chunks():
                if first is None and chunk:
                    first = time.perf_counter() - start
            if answer.status != 200 or first is None:
                raise RuntimeError(f"{pool.base_url}: HTTP {answer.status} or an empty stream")
            firsts.append(first)

    remaining = 2 * concurrency
    await asyncio.gather(*(worker(k) for k in range(concurrency)))  # warm up connections
    firsts.clear()
    remaining = n
    await asyncio.gather(*(worker(k) for k in range(concurrency)))
    for pool in pools.values():
        pool.close()
    return firsts


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"a proxy exited with {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port} after {timeout_s:g} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=2000, help="requests per non-streaming measurement")
    ap.add_argument("--stream-requests", type=int, nargs=2, default=[200, 1000], help="at concurrency 1 and 64")
    ap.add_argument("--repeat", type=int, default=3, help="rounds per row; medians are printed")
    ap.add_argument("--stacks", nargs="+", choices=STACKS, default=STACKS)
    ap.add_argument("--rows", nargs="+", choices=[r[0] for r in ROWS], default=[r[0] for r in ROWS])
    ap.add_argument("--serve", choices=STACKS[:-1], help=argparse.SUPPRESS)
    ap.add_argument("--upstream", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(args.serve, args.upstream, args.port)
        return

    import uvloop
    from gateway import free_port, load, percentile, prepare_attempts, start_gateway

    from agentbolt.testing.fake_llm import FakeLLM, FakeLLMProcess

    run = uvloop.run
    load_avg = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"HTTP stack benchmark: {args.requests} requests per measurement, medians of {args.repeat} rounds; "
        f"backend, proxy and load generator on {os.cpu_count()} cores; load average at start {load_avg}"
    )
    rows = [r for r in ROWS if r[0] in args.rows]
    # results[row][stack or "direct"] -> list of (p50, p99, req/s) per round
    # results[row][stack or "direct"] -> (p50 s, p99 s, req/s, CPU s per request in the serving process) per round
    results: dict[str, dict[str, list[tuple[float, float, float, float]]]] = {r[0]: {} for r in rows}
    with tempfile.TemporaryDirectory(prefix="agentbolt-stack-") as tmp:
        store_url = f"sqlite:///{Path(tmp) / 'gateway.db'}"
        for latency_ms in sorted({r[1] for r in rows}):
            backend = FakeLLM(
                default_reply="The answer is 42.", latency_s=latency_ms / 1000, token_latency_s=0.002, record=False
            )
            with FakeLLMProcess(backend) as server:
                procs: list[subprocess.Popen[bytes]] = []
                urls: dict[str, list[str]] = {}
                serving: dict[str, psutil.Process] = {"direct": psutil.Process(server.pid)}
                try:
                    for stack in args.stacks:
                        port = free_port()
                        if stack == "gateway":
                            procs.append(start_gateway(store_url, server.base_url, port))
                            serving[stack] = psutil.Process(procs[-1].pid)
                            attempts = run(prepare_attempts(store_url, 64))
                            urls[stack] = [f"http://127.0.0.1:{port}/rollouts/{r}/attempts/{a}/v1" for r, a in attempts]
                            continue
                        cmd = [sys.executable, __file__, "--serve", stack, "--upstream", server.base_url]
                        procs.append(subprocess.Popen([*cmd, "--port", str(port)]))
                        wait_port(port, procs[-1])
                        serving[stack] = psutil.Process(procs[-1].pid)
                        urls[stack] = [f"http://127.0.0.1:{port}/v1"]
                    for name, row_latency, conc, stream in rows:
                        if row_latency != latency_ms:
                            continue
                        n = args.stream_requests[conc > 1] if stream else args.requests
                        for round_ in range(args.repeat):
                            shift = round_ % len(args.stacks)
                            order = ["direct", *args.stacks[shift:], *args.stacks[:shift]]
                            for stack in order:
                                base = [server.base_url] if stack == "direct" else urls[stack]
                                cpu = sum(serving[stack].cpu_times()[:2])
                                if stream:
                                    start = time.perf_counter()
                                    lat = run(load_stream(base, n, conc))
                                    rate = n / (time.perf_counter() - start)
                                    sent = n + 2 * conc
                                else:
                                    lat, rate = run(load(base, n, conc))
                                    sent = 2 * n  # load() warms up with as many requests as it measures
                                cpu = (sum(serving[stack].cpu_times()[:2]) - cpu) / sent
                                results[name].setdefault(stack, []).append(
                                    (percentile(lat, 0.5), percentile(lat, 0.99), rate, cpu)
                                )
                        print(f"  done: {name}", file=sys.stderr, flush=True)
                finally:
                    for proc in procs:
                        proc.send_signal(signal.SIGTERM)
                    for proc in procs:
                        try:
                            proc.wait(30)
                        except subprocess.TimeoutExpired:
                            proc.kill()

    def med(row: str, stack: str, col: int) -> float:
        return statistics.median(v[col] for v in results[row][stack])

    def added(row: str, stack: str, col: int) -> float:
        return (med(row, stack, col) - med(row, "direct", col)) * 1e3

    # (header, row, value: "p50" / "p99" latency or "rate" requests/s)
    columns = [
        ("0ms c1 added p50", "0ms c1", "p50"),
        ("req/s", "0ms c1", "rate"),
        ("0ms c64 added p50", "0ms c64", "p50"),
        ("req/s", "0ms c64", "rate"),
        ("CPU/req", "0ms c64", "cpu"),
        ("50ms c64 added p50", "50ms c64", "p50"),
        ("p99", "50ms c64", "p99"),
        ("stream TTFB added p50 c1", "stream c1", "p50"),
        ("c64", "stream c64", "p50"),
    ]
    columns = [c for c in columns if c[1] in args.rows]
    index = {"p50": 0, "p99": 1, "rate": 2, "cpu": 3}

    def cell(stack: str, row: str, value: str) -> str:
        if value == "rate":
            return f"{med(row, stack, 2):,.0f}"
        if value == "cpu":
            return f"{med(row, stack, 3) * 1e6:.0f}us"
        if stack == "direct":
            return f"{med(row, stack, index[value]) * 1e3:.2f}ms"
        return f"{added(row, stack, index[value]):.2f}ms"

    widths = [max(len(header), 9) for header, _, _ in columns]
    head = f"{'stack':>17} | " + " ".join(f"{h:>{w}}" for (h, _, _), w in zip(columns, widths, strict=True))
    print(head)
    print("-" * len(head))
    for stack in ["direct", *args.stacks]:
        cells = [f"{cell(stack, row, value):>{w}}" for (_, row, value), w in zip(columns, widths, strict=True)]
        print(f"{'direct (absolute)' if stack == 'direct' else stack:>17} | " + " ".join(cells))
    for row in [r[0] for r in rows if r[1] > 0]:
        print(f"{row}, added p50 / p99 per round (ms, against the direct run of the same round):")
        direct = results[row]["direct"]
        for stack in args.stacks:
            pairs = [
                f"{(v[0] - d[0]) * 1e3:.2f} / {(v[1] - d[1]) * 1e3:.2f}"
                for v, d in zip(results[row][stack], direct, strict=True)
            ]
            print(f"{stack:>17} | " + ", ".join(pairs))
    load_avg = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"load average at the end: {load_avg}")


if __name__ == "__main__":
    main()
