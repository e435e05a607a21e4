"""Store server throughput: span ingest and rollout lifecycle over HTTP, SQLite behind the server.

Run:  uv run python benchmarks/store_server.py [--spans 50000] [--rollouts 2000] [--repeat 3]

Starts ``agentbolt store serve`` as a subprocess on 127.0.0.1 (a fresh SQLite file per figure)
and drives it with the ``http://`` store client from this process. Prints:

- span ingest, spans/s: ``add_spans`` batches of 100 and 500 spans (about 500 bytes of JSON
  each, 20 concurrently active rollouts of 100 spans), from 1 and from 4 concurrent clients
  (coroutines, each on its own pooled connection);
- rollout lifecycle, rollouts/s: enqueue (batches of 100) -> dequeue -> finish_attempt, with
  one worker claiming one rollout at a time and with 8 workers claiming up to 8 each;
- for reference, the same ingest into the SQLite store in this process (no HTTP).

Client and server share this machine's cores, as they would on one training node.

With ``--runner-clients 64 128 256 512`` it measures instead the store server under that many
concurrent runner clients (coroutines of this process, each with its own pooled connection),
each doing what a runner does per rollout: claim one (``dequeue``), write its spans in one batch
(``--spans-per-rollout``, default 10), report it finished; ``--backend postgres`` puts a
throwaway PostgreSQL behind the server instead of SQLite. Prints rollouts/s, spans/s, the p50 and
p99 time of one claim-spans-finish round, and CPU per rollout of server and clients.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from store import lifecycle as store_lifecycle  # benchmarks/store.py: the same workload as the store benchmark
from store import make_spans

from agentbolt import types as t
from agentbolt.store import open_store
from agentbolt.testing.postgres import throwaway_postgres


@dataclass
class Server:
    url: str
    pid: int

    def cpu_s(self) -> float:
        """CPU seconds the server process has used (Linux; 0 elsewhere)."""
        try:
            fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Figure:
    rate: float
    server_us: float
    client_us: float


@contextmanager
def server(db: Path | str) -> Iterator[Server]:
    """``agentbolt store serve`` on a free port, over a SQLite file or a store URL."""
    url = db if isinstance(db, str) else f"sqlite:///{db}"
    cmd = [sys.executable, "-m", "agentbolt.cli", "store", "serve", "--store", url, "--port", "0"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    found: list[str] = []
    ready = threading.Event()

    def drain() -> None:  # keep reading so the pipe never fills
        assert proc.stderr is not None
        for line in proc.stderr:
            match = re.search(r"listening on (http://\S+)", line)
            if match and not found:
                found.append(match.group(1))
                ready.set()
            elif "Error" in line or "Traceback" in line:
                print(line, end="", file=sys.stderr)

    threading.Thread(target=drain, daemon=True).start()
    try:
        if not ready.wait(60):
            raise RuntimeError("the store server did not start")
        yield Server(found[0], proc.pid)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


async def ingest(url: str, spans: list[t.Span], rollout_ids: list[str], batch: int, clients: int) -> float:
    store = open_store(url)
    try:
        for i in range(0, len(rollout_ids), 100):
            await store.enqueue([t.RolloutSpec(rollout_id=r) for r in rollout_ids[i : i + 100]])
        batches = [spans[i : i + batch] for i in range(0, len(spans), batch)]
        start = time.perf_counter()

        async def client(k: int) -> None:
            for b in batches[k::clients]:
                await store.add_spans(b)

        await asyncio.gather(*(client(k) for k in range(clients)))
        elapsed = time.perf_counter() - start
        stored = await store.query_spans(rollout_ids[:1])
        assert stored[rollout_ids[0]], "spans were not stored"
        return len(spans) / elapsed
    finally:
        await store.close()


async def lifecycle(url: str, n: int, workers: int, claim: int) -> float:
    """Rollouts/s through the server: the store benchmark's loop against an ``http://`` store."""
    return await store_lifecycle(url, n, workers, claim, store_options={})


async def runner_clients(url: str, n: int, clients: int, spans_per_rollout: int) -> tuple[float, list[float]]:
    """``clients`` concurrent runner clients, each looping claim -> spans -> finish until ``n``
    rollouts are done; rollouts/s and the seconds of each round."""
    store = open_store(url, max_connections=clients)
    rounds: list[float] = []
    try:
        tag = secrets.token_hex(4)
        for i in range(0, n, 100):
            await store.enqueue([t.RolloutSpec(rollout_id=f"rc-{tag}-{j}") for j in range(i, min(n, i + 100))])
        start = time.perf_counter()

        async def client(k: int) -> None:
            while True:
                t0 = time.perf_counter()
                claims = await store.dequeue(f"client-{k}", limit=1, lease_s=3600)  # no heartbeats here
                if not claims:
                    return
                rid, aid = claims[0].rollout.rollout_id, claims[0].attempt.attempt_id
                await store.add_spans(
                    [
                        t.Span.create("openai.chat.completions", rollout_id=rid, attempt_id=aid, attributes=ATTRS)
                        for _ in range(spans_per_rollout)
                    ]
                )
                await store.finish_attempt(aid, t.AttemptStatus.SUCCEEDED, reward=1.0)
                rounds.append(time.perf_counter() - t0)

        await asyncio.gather(*(client(k) for k in range(clients)))
        elapsed = time.perf_counter() - start
        assert len(rounds) == n, (len(rounds), n)
        return n / elapsed, rounds
    finally:
        await store.close()


ATTRS = {
    "gen_ai.operation.name": "chat",
    "gen_ai.request.model": "smollm2-135m",
    "gen_ai.usage.input_tokens": 182,
    "gen_ai.usage.output_tokens": 41,
    "agentbolt.token.source": "exact",
}


def runner_client_rows(args: argparse.Namespace) -> None:
    """The ``--runner-clients`` table (see the module docstring)."""

    def rows(store_url: Callable[[], Path | str]) -> None:
        for clients in args.runner_clients:
            best = None
            for _ in range(args.repeat):
                with server(store_url()) as srv:
                    cpu0, mine0 = srv.cpu_s(), time.process_time()
                    rate, rounds = asyncio.run(runner_clients(srv.url, args.rollouts, clients, args.spans_per_rollout))
                    server_ms = (srv.cpu_s() - cpu0) / args.rollouts * 1e3
                    client_ms = (time.process_time() - mine0) / args.rollouts * 1e3
                if best is None or rate > best[0]:
                    best = (rate, rounds, server_ms, client_ms)
            assert best is not None
            rate, rounds, server_ms, client_ms = best
            rounds.sort()
            p50, p99 = rounds[len(rounds) // 2], rounds[min(len(rounds) - 1, int(0.99 * len(rounds)))]
            print(
                f"{args.backend:>8} {clients:>7} | {rate:>10,.0f} {rate * args.spans_per_rollout:>9,.0f} | "
                f"{p50 * 1e3:>8.0f} {p99 * 1e3:>8.0f} | {server_ms:>9.2f} {client_ms:>9.2f}"
            )

    print(
        f"store server under concurrent runner clients ({os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.1f}): {args.rollouts} rollouts x (claim, {args.spans_per_rollout} spans, finish), "
        f"best of {args.repeat}"
    )
    print(
        f"{'backend':>8} {'clients':>7} | {'rollouts/s':>10} {'spans/s':>9} | {'p50 ms':>8} {'p99 ms':>8} | "
        f"{'server ms':>9} {'client ms':>9}  (CPU per rollout)"
    )
    if args.backend == "postgres":
        with throwaway_postgres() as pg:
            rows(lambda: pg)
    else:
        with tempfile.TemporaryDirectory(prefix="agentbolt-bench-") as tmp:
            rows(lambda: Path(tmp) / f"{secrets.token_hex(4)}.db")


def measure(run: Callable[[str], float], units: int, repeat: int, db: Callable[[], Path]) -> Figure:
    """The best of ``repeat`` runs, each against a fresh server and database, with the CPU time
    server and client spent per unit (robust to other load on the machine, unlike the rate)."""
    figures = []
    for _ in range(repeat):
        with server(db()) as srv:
            cpu0, mine0 = srv.cpu_s(), time.process_time()
            rate = run(srv.url)
            figures.append(
                Figure(rate, (srv.cpu_s() - cpu0) / units * 1e6, (time.process_time() - mine0) / units * 1e6)
            )
    return max(figures, key=lambda f: f.rate)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spans", type=int, default=50_000)
    ap.add_argument("--rollouts", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=3, help="runs per figure; the best is printed")
    ap.add_argument("--runner-clients", type=int, nargs="+", help="measure these numbers of concurrent runner clients")
    ap.add_argument("--spans-per-rollout", type=int, default=10, help="with --runner-clients")
    ap.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite", help="with --runner-clients")
    args = ap.parse_args()
    if args.runner_clients:
        runner_client_rows(args)
        return

    rollout_ids = [f"sp-{secrets.token_hex(6)}" for _ in range(args.spans // 100 + 20)]
    spans = make_spans(args.spans, rollout_ids)
    # The prebuilt spans are fixtures, not what a producer keeps alive: keep them out of the
    # collector's full passes, which would otherwise walk them on every request.
    gc.collect()
    gc.freeze()
    print(
        f"store server benchmark ({os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}): "
        f"{args.spans} spans, {args.rollouts} rollouts, best of {args.repeat}; CPU per span/rollout in brackets"
    )
    with tempfile.TemporaryDirectory(prefix="agentbolt-bench-") as tmp:

        def fresh() -> Path:
            return Path(tmp) / f"{secrets.token_hex(4)}.db"

        for batch in (100, 500):
            for clients in (1, 4):
                f = measure(
                    lambda url, b=batch, c=clients: asyncio.run(ingest(url, spans, rollout_ids, b, c)),
                    args.spans,
                    args.repeat,
                    fresh,
                )
                print(
                    f"span ingest over HTTP, batches of {batch:>3}, {clients} client(s): {f.rate:>8,.0f} spans/s "
                    f"(server {f.server_us:.0f} us, client {f.client_us:.0f} us)"
                )
        for workers in (1, 8):
            f = measure(
                lambda url, w=workers: asyncio.run(lifecycle(url, args.rollouts, w, w)),
                args.rollouts,
                args.repeat,
                fresh,
            )
            print(
                f"rollout lifecycle over HTTP, {workers} worker(s) x claim {workers}: {f.rate:>8,.0f} rollouts/s "
                f"(server {f.server_us:.0f} us, client {f.client_us:.0f} us)"
            )
        local = max(asyncio.run(ingest(f"sqlite:///{fresh()}", spans, rollout_ids, 100, 1)) for _ in range(args.repeat))
        print(f"reference: the SQLite store in this process, batches of 100, 1 producer: {local:>8,.0f} spans/s")


if __name__ == "__main__":
    main()
