"""Gateway overhead: added latency (p50/p99) at concurrency 1 and 64, and requests/s, per client API.

Run:  uv run python benchmarks/gateway.py [--requests 3000] [--latency-ms 0 20 100] [--api chat responses messages]

Three processes on this machine: the fake OpenAI backend (``FakeLLMProcess``), the gateway
(``agentbolt gateway serve``, SQLite store, spans written) and this load generator (a
closed loop of C concurrent clients on a keep-alive pool). Each request is a non-streaming chat
completion; through the gateway, the backend is asked for token ids and logprobs and one span
per call goes to the store. ``--api responses`` / ``messages`` send the same question as an OpenAI
Responses API / Anthropic Messages API request to the gateway, which translates it to Chat
Completions upstream and the answer back; their added latency is still measured against calling
the backend directly with Chat Completions (what the agent would otherwise pay).

``--arms durable commit batched`` runs one gateway per arm and alternates direct / durable /
commit / batched loads in every repeat: ``durable`` (the default) appends an answered call to the
local call log before its answer is sent (``--call-log auto``: next to the SQLite file) and
writes the store in background batches; ``commit`` (``--call-log none``) makes the answer wait
for the store's commit instead (group commit, the durable path before the call log);
``batched`` (``--no-durable-calls``) writes records in 50 ms background batches, durable only
once written. ``--base-src DIR`` also runs every arm on another version of the gateway (the
``packages/core/src`` of another commit, e.g. ``git archive main packages/core/src | tar -x -C
/tmp/base``), as arm ``<arm>@base``, alternating with this one in every repeat: a before/after
comparison under the same machine conditions. ``--record PATH`` writes the figures as JSON
(``docs/runs/gateway_call_log.json``), including the gateway process's CPU time per call
(from /proc: less sensitive to other load on the machine than latency is).

``--placement shared pinned`` alternates, in every repeat, two ways of placing the processes on
the cores: ``shared`` (every process may run on every core: the gateway competes with the load
generator and the backend for CPU, as on a small machine running all three) and ``pinned`` (the
gateway alone on the first core, the load generator and the backend on the others, set with
``sched_setaffinity`` on every thread: the gateway's own work, without that contention). The
direct calls are measured under the same placement as the calls through the gateway.

Added latency = percentile through the gateway - the same percentile calling the backend
directly, at the same concurrency, backend latency and placement (median over alternating
repeats). With a fixed backend latency, clients that start together stay in step: at 1 s every
one of the 64 calls reaches the gateway in the same millisecond, every second, and the row
measures how long the gateway takes over a burst of 64 calls. ``--stagger`` starts client k
k/64 of a backend latency late (after the warm-up), as independent agents would arrive; the
requests/s then include that ramp. With a backend that answers in 0 or 50 ms, 64 concurrent clients saturate a 2-core
machine, so those rows mostly measure queueing for CPU (a throughput stress test: an LLM call
takes 0.5-10 s); the rows with a realistic backend latency (``--latency-ms 200 1000``) show what
an agent sees. Each load starts with one warm-up call per client (its connection opened), then
times its calls; the gateway's CPU time per call counts both (before this was fixed, the warm-up
ran as many calls as the load itself while the CPU time was divided as if it were one per
client, so records made before it overstate the CPU per call about twofold).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
from bench_record import load_average, write_record

from agentbolt import types as t
from agentbolt.gateway.upstream import UpstreamPool
from agentbolt.store import open_store
from agentbolt.testing.fake_llm import FakeLLM, FakeLLMProcess


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


QUESTION = "What is 6 times 7?"
APIS = {
    "chat": (
        "/chat/completions",
        {"model": "fake-model", "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 16},
    ),
    "responses": ("/responses", {"model": "fake-model", "input": QUESTION, "max_output_tokens": 16}),
    "messages": (
        "/messages",
        {"model": "fake-model", "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 16},
    ),
}
"""Client API -> (path under the base URL, request body)."""


async def load(
    base_urls: list[str], n: int, concurrency: int, api: str = "chat", stagger_s: float = 0.0
) -> tuple[list[float], float]:
    """Closed loop: ``concurrency`` workers; worker k uses base_urls[k % len] and, after the
    warm-up, starts ``k / concurrency * stagger_s`` late. Returns latencies, req/s."""
    pools = {url: UpstreamPool(url, max_idle=512) for url in set(base_urls)}
    path, request = APIS[api]
    body = orjson.dumps(request)
    headers = [("content-type", "application/json")]
    latencies: list[float] = []
    remaining = n

    async def worker(k: int, delay_s: float = 0.0) -> None:
        nonlocal remaining
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        url = base_urls[k % len(base_urls)]
        pool = pools[url]
        while remaining > 0:
            remaining -= 1
            start = time.perf_counter()
            resp = await pool.request("POST", path, body, headers, timeout_s=60)
            data = await resp.read()
            if resp.status != 200:
                raise RuntimeError(f"{url}: HTTP {resp.status}: {data[:300]!r}")
            latencies.append(time.perf_counter() - start)

    # warm up connections: one call per worker (the measured calls start on open connections)
    remaining = concurrency
    await asyncio.gather(*(worker(k) for k in range(concurrency)))
    latencies.clear()
    remaining = n
    start = time.perf_counter()
    await asyncio.gather(*(worker(k, k / concurrency * stagger_s) for k in range(concurrency)))
    elapsed = time.perf_counter() - start
    for pool in pools.values():
        pool.close()
    return latencies, n / elapsed


ARMS = {
    "durable": ["--durable-calls", "--call-log", "auto"],
    "commit": ["--durable-calls", "--call-log", "none"],
    "batched": ["--no-durable-calls"],
}
"""Gateway arm -> its ``agentbolt gateway serve`` flags."""


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc; NaN elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


PLACEMENTS = ("shared", "pinned")
"""``shared``: every process may run on every core (the scheduler decides); ``pinned``: the
gateway alone on the first core, this load generator and the fake backend on the others."""


def place(pids: list[int], cores: set[int]) -> None:
    """Restrict every thread of the processes ``pids`` (0: this one) to ``cores``."""
    for pid in pids:
        for task in Path(f"/proc/{pid or os.getpid()}/task").iterdir():
            with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
                os.sched_setaffinity(int(task.name), cores)


def start_gateway(
    store_url: str, upstream: str, port: int, arm: str = "durable", base_src: Path | None = None
) -> subprocess.Popen[bytes]:
    """Start ``agentbolt gateway serve`` with ``arm``'s flags (``<arm>@base``: from ``base_src``)."""
    env = dict(os.environ)
    if arm.endswith("@base"):
        if base_src is None:
            raise ValueError(f"arm {arm} needs --base-src")
        env["PYTHONPATH"] = os.pathsep.join([str(base_src), *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agentbolt.cli",
            "gateway",
            "serve",
            "--store",
            store_url,
            "--upstream",
            upstream,
            "--port",
            str(port),
            *ARMS[arm.removesuffix("@base")],
        ],
        stderr=subprocess.PIPE,
        env=env,
    )
    assert proc.stderr is not None
    line = proc.stderr.readline().decode()
    if "listening" not in line:
        raise RuntimeError(f"gateway did not start: {line}{proc.stderr.read().decode()}")
    return proc


async def prepare_attempts(store_url: str, n: int) -> list[tuple[str, str]]:
    store = open_store(store_url)
    tag = secrets.token_hex(3)
    await store.enqueue([t.RolloutSpec(rollout_id=f"bench-{tag}-{i}") for i in range(n)])
    claims = await store.dequeue("bench", limit=n, lease_s=3600)
    await store.close()
    return [(c.rollout.rollout_id, c.attempt.attempt_id) for c in claims]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--latency-ms", type=float, nargs="+", default=[0.0, 50.0, 100.0])
    ap.add_argument("--repeat", type=int, default=3, help="direct/gateway pairs per row; medians are printed")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--api", nargs="+", choices=sorted(APIS), default=["chat", "responses", "messages"])
    ap.add_argument("--arms", nargs="+", choices=sorted(ARMS), default=["durable"], help="gateways to compare")
    ap.add_argument(
        "--base-src",
        type=Path,
        help="another version's packages/core/src: every arm also runs on it, as '<arm>@base'",
    )
    ap.add_argument(
        "--placement",
        nargs="+",
        choices=PLACEMENTS,
        default=["shared"],
        help="where the processes run, alternated in every repeat: 'shared' (all on all cores) and/or "
        "'pinned' (the gateway alone on the first core, backend and load generator on the others: the "
        "gateway's own work without CPU contention with them)",
    )
    ap.add_argument(
        "--stagger",
        action="store_true",
        help="clients start spread evenly over one backend latency, as independent agents would, instead of "
        "all at once (with a fixed backend latency, clients that start together stay in step for the whole load)",
    )
    ap.add_argument("--record", type=Path, help="write the rows as JSON here")
    args = ap.parse_args()
    all_cores = set(os.sched_getaffinity(0))
    if "pinned" in args.placement and len(all_cores) < 2:
        ap.error(f"--placement pinned needs at least 2 cores; this process may use {len(all_cores)}")
    gateway_core = {min(all_cores)}
    cores = {
        "shared": (all_cores, all_cores),  # (the gateway's, the backend's and load generator's)
        "pinned": (gateway_core, all_cores - gateway_core),
    }
    if args.base_src is not None:
        if not (args.base_src / "agentbolt" / "gateway").is_dir():
            ap.error(f"--base-src {args.base_src}: no agentbolt/gateway package there (pass a packages/core/src)")
        args.arms = [name for arm in args.arms for name in (f"{arm}@base", arm)]
    try:
        import uvloop

        run = uvloop.run
    except ImportError:  # pragma: no cover
        run = asyncio.run
    print(
        f"gateway benchmark: up to {args.requests} chat completions per row; backend, gateway and load generator "
        f"on {len(all_cores)} cores (pinned: the gateway on core {min(all_cores)}, the others on the rest)"
    )
    print(
        f"{'api':>9} {'arm':>14} {'placement':>9} {'backend':>9} {'conc':>5} | {'direct p50':>10} {'p99':>8} | {'gateway p50':>11} {'p99':>8} | {'added p50':>9} {'p99':>8} | {'gw req/s':>9} | {'gw cpu/call':>8}"
    )
    record: list[dict[str, object]] = []
    load_start = load_average()
    with tempfile.TemporaryDirectory(prefix="agentbolt-gw-") as tmp:
        for latency_ms in args.latency_ms:
            backend = FakeLLM(default_reply="The answer is 42.", latency_s=latency_ms / 1000, record=False)
            with FakeLLMProcess(backend) as server:
                gateways: dict[str, subprocess.Popen[bytes]] = {}
                routes: dict[str, list[str]] = {}
                try:
                    for arm in args.arms:
                        store_url = f"sqlite:///{Path(tmp) / f'gateway-{arm}-{latency_ms:g}.db'}"
                        port = free_port()
                        gateways[arm] = start_gateway(store_url, server.base_url, port, arm, args.base_src)
                        attempts = run(prepare_attempts(store_url, 64))
                        routes[arm] = [f"http://127.0.0.1:{port}/rollouts/{r}/attempts/{a}/v1" for r, a in attempts]
                    for api, conc in [(api, conc) for conc in args.concurrency for api in args.api]:
                        n = (
                            args.requests
                            if latency_ms == 0
                            else min(args.requests, int(conc * 1000 / max(latency_ms, 1) * 6) + conc)
                        )
                        stagger = latency_ms / 1000 if args.stagger else 0.0
                        rows: dict[tuple[str, str], list[tuple[float, ...]]] = {
                            (arm, where): [] for where in args.placement for arm in args.arms
                        }
                        for _ in range(args.repeat):  # alternate, so every arm sees the same machine conditions
                            for where in args.placement:
                                gateway_cores, other_cores = cores[where]
                                place([g.pid for g in gateways.values()], gateway_cores)
                                place([0, server.pid or 0], other_cores)
                                direct, _ = run(load([server.base_url], n, conc, stagger_s=stagger))
                                for arm in args.arms:
                                    cpu = cpu_seconds(gateways[arm].pid)
                                    through, rate = run(load(routes[arm], n, conc, api, stagger))
                                    cpu = cpu_seconds(gateways[arm].pid) - cpu
                                    rows[(arm, where)].append(
                                        (
                                            percentile(direct, 0.5) * 1e3,
                                            percentile(direct, 0.99) * 1e3,
                                            percentile(through, 0.5) * 1e3,
                                            percentile(through, 0.99) * 1e3,
                                            rate,
                                            cpu / (n + conc) * 1e3,  # the warm-up calls count too (one per worker)
                                        )
                                    )
                        for (arm, where), runs in rows.items():
                            d50, d99, g50, g99, rate, cpu_ms = (
                                statistics.median(col) for col in zip(*runs, strict=True)
                            )
                            added = [(r[2] - r[0], r[3] - r[1]) for r in runs]
                            print(
                                f"{api:>9} {arm:>14} {where:>9} {latency_ms:>7.0f}ms {conc:>5} | {d50:>8.2f}ms {d99:>6.2f}ms | {g50:>9.2f}ms {g99:>6.2f}ms | "
                                f"{g50 - d50:>7.2f}ms {g99 - d99:>6.2f}ms | {rate:>9,.0f} | {cpu_ms:>6.3f}ms",
                                flush=True,
                            )
                            record.append(
                                {
                                    "api": api,
                                    "arm": arm,
                                    "placement": where,
                                    "backend_latency_ms": latency_ms,
                                    "concurrency": conc,
                                    "requests": n,
                                    "direct_p50_ms": round(d50, 3),
                                    "direct_p99_ms": round(d99, 3),
                                    "gateway_p50_ms": round(g50, 3),
                                    "gateway_p99_ms": round(g99, 3),
                                    "added_p50_ms": round(g50 - d50, 3),
                                    "added_p99_ms": round(g99 - d99, 3),
                                    "requests_per_s": round(rate, 1),
                                    "gateway_cpu_ms_per_call": round(cpu_ms, 3),
                                    "repeats_added_p50_ms": [round(a, 3) for a, _ in added],
                                    "repeats_added_p99_ms": [round(b, 3) for _, b in added],
                                    "repeats_gateway_cpu_ms_per_call": [round(r[5], 3) for r in runs],
                                }
                            )
                finally:
                    place([0], all_cores)
                    for gateway in gateways.values():
                        gateway.send_signal(signal.SIGTERM)
                        gateway.wait(30)
    if args.record is not None:
        write_record(
            args.record,
            "benchmarks/gateway.py",
            load_start,
            base_src=None if args.base_src is None else str(args.base_src),
            staggered_starts=args.stagger,
            placements={
                where: {"gateway": sorted(g), "backend_and_load": sorted(o)}
                for where, (g, o) in cores.items()
                if where in args.placement
            },
            rows=record,
        )


if __name__ == "__main__":
    main()
