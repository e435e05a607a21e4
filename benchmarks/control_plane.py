"""Control-plane throughput: rollouts/s of a synthetic agent through store + runner processes.

Run:  uv run python benchmarks/control_plane.py [--rollouts 500] [--processes 1 2 4] [--concurrency 32]

The agent runs 3 turns; each turn emits 4 spans and sleeps 5 ms (no LLM: this measures the
control plane). Rollouts go through the durable SQLite store (WAL, synchronous=NORMAL) with
runner processes claiming them under leases, heartbeating, writing spans and reporting results.
The figure is rollouts/s from the enqueue of all rollouts until the last one is final, with the
runner processes already started and waiting.

``--runners ray`` runs the same with runner workers as Ray actors (a local Ray cluster of 2 CPUs
on 127.0.0.1, :mod:`agentbolt.runners.ray`) instead of runner processes; ``--processes`` is then
the number of actors.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from control_plane_agent import synthetic_agent

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.runners.pool import RunnerPool
from agentbolt.runners.runner import RunnerConfig
from agentbolt.store import open_store


async def measure(
    url: str, n: int, processes: int, concurrency: int, runners: str = "processes"
) -> tuple[float, dict[str, int]]:
    store = open_store(url)
    config = RunnerConfig(concurrency=concurrency, dequeue_wait_s=1.0)
    pool: Any
    if runners == "ray":
        from agentbolt.runners.ray import RayRunnerPool, RayWorkerOptions

        pool = RayRunnerPool(
            synthetic_agent, url, workers=processes, config=config, options=RayWorkerOptions(num_cpus=0)
        )
    else:
        pool = RunnerPool(synthetic_agent, url, processes=processes, config=config)
    await asyncio.to_thread(pool.start)
    try:
        await asyncio.to_thread(pool.wait_ready)  # imports done, claiming
        specs = [t.RolloutSpec(rollout_id=f"r{i}", input={"i": i}) for i in range(n)]
        start = time.perf_counter()
        await store.enqueue(specs)
        states = await store.wait_for_rollouts([s.rollout_id for s in specs], timeout=600)  # type: ignore[misc]
        elapsed = time.perf_counter() - start
        ok = sum(r.status is t.RolloutStatus.SUCCEEDED for r in states)
        spans = await store.query_spans([s.rollout_id for s in specs[:5]])  # type: ignore[misc]
        # 13 spans of the agent's own; the runner adds one capture span when adapters are installed
        own = {k: [s for s in v if s.name != semconv.SPAN_CAPTURE] for k, v in spans.items()}
        assert all(len(v) == 13 for v in own.values()), {k: len(v) for k, v in own.items()}
        return n / elapsed, {"succeeded": ok, "total": n}
    finally:
        await asyncio.to_thread(pool.stop)
        await store.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rollouts", type=int, default=500)
    ap.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--concurrency", type=int, default=32, help="rollouts each runner process runs at once")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument(
        "--runners", choices=["processes", "ray"], default="processes", help="runner processes or Ray actors"
    )
    args = ap.parse_args()
    if args.runners == "ray":
        os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")  # workers run this interpreter, not `uv run`
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    print(
        f"control plane: {args.rollouts} rollouts x (3 turns x 4 spans + 5 ms sleep), SQLite store, "
        f"{args.concurrency} concurrent per runner process, best of {args.repeat}"
    )
    with tempfile.TemporaryDirectory(prefix="agentbolt-cp-") as tmp:
        for processes in args.processes:
            best = 0.0
            for k in range(args.repeat):
                url = f"sqlite:///{Path(tmp) / f'cp-{processes}-{k}.db'}"
                rate, counts = asyncio.run(measure(url, args.rollouts, processes, args.concurrency, args.runners))
                assert counts["succeeded"] == counts["total"], counts
                best = max(best, rate)
            what = "Ray runner actor(s)" if args.runners == "ray" else "runner process(es)"
            print(f"  {processes} {what}: {best:,.0f} rollouts/s  ({os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
