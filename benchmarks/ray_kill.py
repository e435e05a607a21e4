"""Reliability with Ray actors: 1,000 rollouts while runner actors are killed mid-rollout.

Run:  uv run python benchmarks/ray_kill.py [--rollouts 1000] [--workers 2] [--concurrency 16] [--kills 4]
      [--store postgres|server]

A local Ray cluster (2 CPUs, 127.0.0.1) runs ``--workers`` runner actors (:mod:`agentbolt.runners.ray`)
against PostgreSQL (``--store postgres``, a throwaway server) or the store server over SQLite
(``--store server``). The agent makes two LLM calls through the gateway to the fake
OpenAI-compatible backend (one streamed, 20 ms each) and returns a reward derived from its task.
Every time another 1/(kills+1) of the rollouts has finished, a worker holding rollouts is killed:
alternately with ``os.kill(pid, SIGKILL)`` and with ``ray.kill(actor, no_restart=False)``; Ray
restarts it, the store expires the dead worker's leases and hands its rollouts out again.

Prints the reliability suite's figures: terminal (rollouts in a final state), lost (not
succeeded), run twice to success (succeeded on a later attempt), duplicated (a rollout with more
than one succeeded attempt, or whose kept LLM calls are not exactly its agent's two), wrong
reward (a reward that is not its own task's), and the restarts Ray made.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")  # workers run this interpreter, not `uv run`
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from ray_kill_agent import two_call_agent

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.gateway import Gateway
from agentbolt.runners.ray import RayRunnerPool, RayWorkerOptions
from agentbolt.runners.runner import RunnerConfig
from agentbolt.store import Store, open_store
from agentbolt.store.server import ServerThread
from agentbolt.testing.fake_llm import FakeLLM, FakeLLMServer
from agentbolt.testing.postgres import throwaway_postgres


@contextlib.contextmanager
def store_url(kind: str) -> Iterator[tuple[str, str]]:
    """(URL the benchmark opens, URL the workers open)."""
    if kind == "postgres":
        with throwaway_postgres() as url:
            yield url, url
        return
    with tempfile.TemporaryDirectory(prefix="agentbolt-raykill-") as tmp:
        url = f"sqlite:///{tmp}/runs.db"
        yield url, ""


async def holders(store: Store) -> dict[str, int]:
    """Running attempts per worker id."""
    out: dict[str, int] = {}
    running = await store.query_rollouts(status=t.RolloutStatus.RUNNING, limit=10_000)
    for rollout in running.items:
        attempts = await store.get_attempts(rollout.rollout_id)
        if attempts and attempts[-1].status is t.AttemptStatus.RUNNING and attempts[-1].worker_id:
            out[attempts[-1].worker_id] = out.get(attempts[-1].worker_id, 0) + 1
    return out


async def run(args: argparse.Namespace, url: str, worker_url: str) -> None:
    import ray

    store = open_store(url)
    backend = FakeLLM(default_reply=lambda req: f"reply to {req.text}", latency_s=0.02)
    server = FakeLLMServer(backend)
    await server.__aenter__()
    gateway = Gateway(store, [server.base_url])
    await gateway.start()
    await store.add_resources(t.Resources(llm=t.LLMEndpoint(base_url=f"{gateway.url}/v1", model="fake-model")))
    store_server = None
    if not worker_url:  # the store server over the SQLite file
        store_server = ServerThread(store)
        store_server.start()
        worker_url = store_server.url
    ray.init(address="local", num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1")
    pool = RayRunnerPool(
        two_call_agent,
        worker_url,
        workers=args.workers,
        config=RunnerConfig(concurrency=args.concurrency, lease_s=args.lease),
        options=RayWorkerOptions(num_cpus=0.5),
    )
    n = args.rollouts
    ids = [f"r{i}" for i in range(n)]
    kills: list[str] = []
    try:
        await asyncio.to_thread(pool.start)
        await asyncio.to_thread(pool.wait_ready, 180)
        started = time.perf_counter()
        await store.enqueue(
            [t.RolloutSpec(rollout_id=rid, input={"i": i}, max_attempts=args.max_attempts) for i, rid in enumerate(ids)]
        )
        for k in range(args.kills):
            target = n * (k + 1) // (args.kills + 1)
            while True:  # poll the store: the figure the kills are timed on
                if (await store.count_rollouts())[t.RolloutStatus.SUCCEEDED] >= target:
                    break
                await asyncio.sleep(0.05)
            statuses = await asyncio.to_thread(pool.status)
            held = await holders(store)
            victim = max(
                (s for s in statuses if s.alive and s.worker_id),
                key=lambda s: held.get(s.worker_id or "", 0),
                default=None,
            )
            if victim is None or not held.get(victim.worker_id or ""):
                kills.append("skipped (no live worker held rollouts)")
                continue
            how = "SIGKILL" if k % 2 == 0 else "ray.kill"
            if how == "SIGKILL":
                os.kill(victim.pid, signal.SIGKILL)  # type: ignore[arg-type]
            else:
                ray.kill(pool.actors[victim.index], no_restart=False)
            kills.append(f"{how} of worker {victim.index} holding {held[victim.worker_id or '']} rollouts")
        rollouts = await store.wait_for_rollouts(ids, timeout=args.timeout)
        elapsed = time.perf_counter() - started
        restarts = sum(s.restarts_seen for s in await asyncio.to_thread(pool.status, 30))
    finally:
        await asyncio.to_thread(pool.stop)
        ray.shutdown()
    await gateway.flush()
    spans = await store.query_spans(ids, latest_attempt_only=True)
    terminal = sum(r.status.is_final for r in rollouts)
    succeeded = [r for r in rollouts if r.status is t.RolloutStatus.SUCCEEDED]
    lost = n - len(succeeded)
    twice = sum(r.attempt_count > 1 for r in succeeded)
    duplicated = wrong = 0
    for i, r in enumerate(rollouts):
        attempts = await store.get_attempts(r.rollout_id)
        calls = [s for s in spans.get(r.rollout_id, []) if s.attributes.get(semconv.SPAN_KIND_ATTR) == semconv.KIND_LLM]
        if [a.status for a in attempts].count(t.AttemptStatus.SUCCEEDED) > 1 or (
            r.status is t.RolloutStatus.SUCCEEDED and len(calls) != 2
        ):
            duplicated += 1
        if r.status is t.RolloutStatus.SUCCEEDED and r.final_reward != i / 1000:
            wrong += 1
    for line in kills:
        print(f"  kill: {line}")
    print(
        f"ray actors ({args.workers} x {args.concurrency}, store {args.store}): {n} rollouts, {len(kills)} kills, "
        f"{restarts} restarts seen, {elapsed:.1f} s"
    )
    print(
        f"  terminal {terminal}/{n}, lost {lost}, run twice to success {twice}, duplicated {duplicated}, "
        f"wrong reward {wrong}"
    )
    if store_server is not None:
        store_server.stop()
    await gateway.stop()
    await server.__aexit__(None, None, None)
    await store.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rollouts", type=int, default=1000)
    ap.add_argument("--workers", type=int, default=2, help="Ray runner actors")
    ap.add_argument("--concurrency", type=int, default=16, help="rollouts each actor runs at once")
    ap.add_argument("--kills", type=int, default=4, help="workers killed during the run")
    ap.add_argument("--lease", type=float, default=3.0, help="lease seconds (a dead worker's rollouts wait this)")
    ap.add_argument("--max-attempts", type=int, default=3)
    ap.add_argument("--store", choices=["postgres", "server"], default="postgres")
    ap.add_argument("--timeout", type=float, default=900.0)
    args = ap.parse_args()
    with store_url(args.store) as (url, worker_url):
        asyncio.run(run(args, url, worker_url))
    return 0


if __name__ == "__main__":
    sys.exit(main())
