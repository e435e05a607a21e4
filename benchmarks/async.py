"""Synchronous vs asynchronous training (``max_staleness`` K = 1, 2), side by side (not in CI).

Run:  uv run python benchmarks/async.py [--model tiny|smollm2] [--steps 6] [--agents tail plain]
      [--bounds sync 1 2] [--rounds 1] [--record docs/runs/async_benchmark.json] [--plot curve.png]
      uv run python benchmarks/async.py --report docs/runs/async_benchmark.json [--plot curve.png]  # from a record

Two agents on the quickstart's arithmetic questions (``examples/quickstart/math_tasks.py``):

- **tail**: a long-tailed agent: the quickstart agent (its few-shot prompt, its calculator tool,
  up to three model calls) whose tools are slow. Before asking the model it makes a lookup
  (as an agent fetching context from an API does), and each calculator call the model makes
  takes as long again: each a log-normal time (median ``--median-s`` 0.5 s, sigma ``--sigma``
  1.0: p99 = 10.2x the median). Every rollout pays at least one.
- **plain**: the same agent without the latency (CPU-bound: the cost of async where
  generation and the update compete for the cores).

Each arm is a fresh subprocess (``torch-grpo``, in-process runner, in-memory store) and the arms
alternate (tail-sync, tail-K1, tail-K2, plain-...; ``--rounds``) so that contention on a shared
machine hits all of them. Printed per arm: wall-clock of training (evaluations excluded), s/step,
steps/hour, the share of each step the trainer waited for rollouts and the rollouts waited for
the trainer, the staleness histogram of the trained calls, stale calls dropped, rollouts left
untrained, held-out accuracy at each evaluation with the training wall-clock reached then; and
for each async arm the held-out accuracy at the sync arm's step count and at its wall-clock, and
its wall-clock to reach the sync arm's final held-out accuracy as a ratio of sync's (goal <= 0.6
on the tail agent). On the random ``tiny`` model held-out accuracy stays 0: those runs measure
time only.

Each arm runs in a process of its own with the malloc settings ``./dev`` gives training
processes (read from ``./dev``, as ``benchmarks/quickstart_memory.py`` does).

``--watch SECONDS`` (off by default) watches each arm for a stall: a daemon thread in the arm's
process writes, every SECONDS, the generation engine's and the async scheduler's state
(``TorchGRPO.state()``), the gateway's counters (calls in flight) and the store's rollouts (counts
by status, the running ones with their age) to ``<out>/<agent>-<arm>/watch.log``, and every 4th
time every thread's stack to ``watch.stacks`` beside it. It exists to catch the hang seen once at
a K = 2 held-out evaluation (docs/benchmarks.md, "Asynchronous training").
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import faulthandler
import json
import math
import os
import random
import resource
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples" / "quickstart"))
sys.path.insert(0, str(REPO / "benchmarks"))
from quickstart_memory import dev_environment  # noqa: E402  # ./dev's malloc settings, read from ./dev


def make_agent(median_s: float, sigma: float, seed: int) -> Any:
    """The benchmark's tail agent: the quickstart agent behind a slow lookup, its calculator as slow (module doc)."""
    from agent import math_agent

    rng = random.Random(seed)

    async def tool_latency() -> None:
        if median_s > 0:
            await asyncio.sleep(median_s * math.exp(sigma * rng.gauss(0.0, 1.0)))

    async def agent(task: dict[str, Any], resources: Any) -> float:
        await tool_latency()  # the lookup every rollout makes before asking the model
        return await math_agent(task, resources, tool_delay=tool_latency)  # each calculator call as slow

    return agent


class Watch:
    """``--watch``: a daemon thread that appends the run's state to ``out_dir/watch.log`` every
    ``period_s`` and every thread's stack to ``out_dir/watch.stacks`` every 4th time (module doc).

    Args:
        algorithm: the arm's algorithm (``state()``, and ``phase``: what the run is doing).
        ctx: the algorithm context (the gateway's counters, the store's rollouts).
        loop: the training event loop (the store is read on it).
    """

    ANSWER_S = 5.0
    """How long a read that needs another thread's event loop may take before it is reported unanswered."""

    def __init__(
        self, algorithm: Any, ctx: Any, loop: asyncio.AbstractEventLoop, out_dir: Path, period_s: float
    ) -> None:
        self.algorithm, self.ctx, self.loop, self.period_s = algorithm, ctx, loop, period_s
        out_dir.mkdir(parents=True, exist_ok=True)
        self.log_path, self.stacks_path = out_dir / "watch.log", out_dir / "watch.stacks"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="async-benchmark-watch", daemon=True)
        self._gateway_call: threading.Thread | None = None
        self._gateway_stats: Any = None

    def start(self) -> Watch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2 * self.ANSWER_S + 1)

    def lines(self) -> list[str]:
        """One line per component: the run's phase, the engine and the stream (while they exist),
        the gateway, the store."""
        live = {name: value for name, value in self.algorithm.state().items() if value is not None}
        return [
            f"phase {self.algorithm.phase}",
            *(f"{name} {json.dumps(value)}" for name, value in live.items()),
            f"gateway {json.dumps(self._gateway(), default=str)}",
            f"store {json.dumps(self._store(), default=str)}",
        ]

    def _watch(self) -> None:
        started = time.monotonic()
        with self.log_path.open("a") as log, self.stacks_path.open("a") as stacks:
            tick = 0
            while not self._stop.wait(self.period_s):
                tick += 1
                stamp = f"{time.strftime('%H:%M:%S')} t={time.monotonic() - started:.0f}s"
                try:
                    lines = self.lines()
                except Exception as exc:  # a diagnostic must not die on what it diagnoses
                    lines = [f"failed: {exc!r}"]
                log.write("".join(f"{stamp} {line}\n" for line in lines))
                log.flush()
                if tick % 4 == 0:
                    names = ", ".join(f"{t.ident:#018x} {t.name}" for t in threading.enumerate())
                    stacks.write(f"==== {stamp} (threads: {names})\n")
                    stacks.flush()
                    faulthandler.dump_traceback(stacks, all_threads=True)
            log.write(f"{time.strftime('%H:%M:%S')} watch stopped: the run ended\n")

    def _gateway(self) -> Any:
        """The gateway's counters; its thread answers them, so a stuck gateway shows as no answer
        (and no second call piles up behind the first)."""
        if self._gateway_call is None or not self._gateway_call.is_alive():

            def call() -> None:
                try:
                    self._gateway_stats = self.ctx.gateway.stats()
                except Exception as exc:
                    self._gateway_stats = f"failed: {exc!r}"

            self._gateway_stats = None
            self._gateway_call = threading.Thread(target=call, name="async-benchmark-watch-gateway", daemon=True)
            self._gateway_call.start()
        self._gateway_call.join(self.ANSWER_S)
        if self._gateway_stats is None:
            return f"no answer in {self.ANSWER_S:g} s (the gateway's event loop is stuck?)"
        return self._gateway_stats

    def _store(self) -> Any:
        """Rollouts by status and the running ones (id, seconds running), read on the training loop."""

        async def read() -> dict[str, Any]:
            from agentbolt.types import RolloutStatus

            store = self.ctx.store
            counts = await store.count_rollouts()
            running = (await store.query_rollouts(status=RolloutStatus.RUNNING, limit=16)).items
            now = time.time()
            return {
                "counts": {status.value: n for status, n in counts.items() if n},
                "running": [f"{r.rollout_id} {now - (r.started_at or now):.0f}s" for r in running],
            }

        future = asyncio.run_coroutine_threadsafe(read(), self.loop)
        try:
            return future.result(self.ANSWER_S)
        except concurrent.futures.TimeoutError:
            future.cancel()
            return f"no answer in {self.ANSWER_S:g} s (the training event loop is blocked?)"


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One arm, in this process: prints and returns its figures."""
    from math_tasks import make_tasks

    from agentbolt.options import RunnerOptions
    from agentbolt.trainer import Trainer
    from agentbolt_torch.training.algorithm import TorchGRPO
    from agentbolt_torch.training.asynchronous import rollouts_in_flight

    bound = None if args.bound == "sync" else int(args.bound)
    evaluations: list[dict[str, float]] = []
    clock = {"start": 0.0, "in_eval": 0.0}

    out_dir = Path(args.out) / f"{args.agent}-{args.bound}"

    class Timed(TorchGRPO):
        """torch-grpo noting each evaluation's accuracy and the training wall-clock reached then
        (and, with ``--watch``, watched while it runs)."""

        phase = "starting"

        async def run(self, ctx: Any, train: Any, val: Any) -> Any:
            watch = Watch(self, ctx, asyncio.get_running_loop(), out_dir, args.watch).start() if args.watch else None
            try:
                return await super().run(ctx, train, val)
            finally:
                if watch is not None:
                    await asyncio.to_thread(watch.stop)  # its last read may wait on this loop

        async def _evaluate(self, ctx: Any, policy: Any, val: Any, *, step: int, log_step: Any) -> Any:
            began = time.monotonic()
            self.phase = f"held-out evaluation after step {step}"
            try:
                out = await super()._evaluate(ctx, policy, val, step=step, log_step=log_step)
            finally:
                self.phase = f"training (last evaluation: after step {step})"
            if not clock["start"]:
                clock["start"] = time.monotonic()
            else:
                clock["in_eval"] += time.monotonic() - began
                evaluations.append(
                    {
                        "step": step,
                        "accuracy": out[0],
                        "train_wall_s": round(time.monotonic() - clock["start"] - clock["in_eval"], 1),
                    }
                )
            return out

    algorithm = Timed(
        args.model,
        steps=args.steps,
        batch_size=args.batch_size,
        group_size=args.group_size,
        sampling={"max_tokens": args.max_tokens},
        evaluation={"every": args.val_every},
        output={"out_dir": out_dir, "plot": False},
        seed=args.seed,
    )
    median = args.median_s if args.agent == "tail" else 0.0
    trainer = Trainer(
        make_agent(median, args.sigma, args.seed),
        algorithm,
        store="memory://",
        runners=RunnerOptions(n=0, concurrency=rollouts_in_flight(args.batch_size, args.group_size, bound)),
        progress=False,
    )
    train = make_tasks(4000, seed=1, prefix="train-", heldout=False)
    val = make_tasks(args.val, seed=2, prefix="val-", heldout=True)
    result = trainer.fit(train, val, max_staleness=bound)
    steps = [h for h in result.history if "time/step_s" in h]
    staleness: Counter[int] = Counter()
    for h in steps:
        for key, value in h.items():
            if key.startswith("lightningrl/staleness/") and key.rsplit("/", 1)[1].isdigit():
                staleness[int(key.rsplit("/", 1)[1])] += int(value)
    train_wall = evaluations[-1]["train_wall_s"] if evaluations else float("nan")

    def mean(key: str) -> float:
        values = [h[key] for h in steps if key in h]
        return round(sum(values) / len(values), 3) if values else float("nan")

    return {
        "agent": args.agent,
        "bound": args.bound,
        "model": args.model,
        "steps": result.steps,
        "train_wall_s": train_wall,
        "s_per_step": round(train_wall / max(result.steps, 1), 2),
        "steps_per_hour": round(3600 * result.steps / train_wall, 1) if train_wall else float("nan"),
        "trainer_wait_share": mean("time/trainer_wait_share"),
        "rollouts_wait_share": mean("time/rollouts_wait_share"),
        "update_s": mean("time/update_s"),
        "staleness": dict(sorted(staleness.items())),
        "stale_calls": result.stale_calls,
        "untrained_rollouts": result.untrained_rollouts,
        "accuracy_before": result.accuracy_before,
        "evaluations": evaluations,
        "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
    }


def at_or_before(evaluations: list[dict[str, float]], key: str, limit: float) -> float | None:
    """The accuracy of the last evaluation with ``key`` <= ``limit``."""
    found = [e["accuracy"] for e in evaluations if e[key] <= limit + 1e-9]
    return found[-1] if found else None


def _acc(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def compare(results: list[dict[str, Any]]) -> list[str]:
    """Each async arm against its agent's sync arm (first round of each)."""
    lines = []
    for agent in dict.fromkeys(r["agent"] for r in results):
        sync = next((r for r in results if r["agent"] == agent and r["bound"] == "sync"), None)
        if sync is None or not sync["evaluations"]:
            continue
        target, wall, steps = sync["evaluations"][-1]["accuracy"], sync["train_wall_s"], sync["steps"]
        for r in results:
            if r["agent"] != agent or r["bound"] == "sync" or not r["evaluations"]:
                continue
            if not any(e["accuracy"] for x in (sync, r) for e in x["evaluations"]):
                lines.append(
                    f"{agent:<6} K={r['bound']}: wall-clock {r['train_wall_s'] / wall:.2f}x sync's for the same "
                    f"{steps} steps; held-out accuracy 0 in both arms (nothing learned: time only)"
                )
                continue
            reached = [e["train_wall_s"] for e in r["evaluations"] if e["accuracy"] >= target]
            when = (
                f"reached sync's final accuracy at {reached[0] / wall:.2f}x sync's wall-clock"
                if reached and wall
                else f"did not reach sync's final accuracy in its {r['steps']} steps"
            )
            lines.append(
                f"{agent:<6} K={r['bound']}: wall-clock {r['train_wall_s'] / wall:.2f}x sync's for the same "
                f"{steps} steps; held-out accuracy at sync's step count "
                f"{_acc(at_or_before(r['evaluations'], 'step', steps))} (sync {target:.3f}), at sync's wall-clock "
                f"{_acc(at_or_before(r['evaluations'], 'train_wall_s', wall))}; {when}"
            )
    return lines


def report(results: list[dict[str, Any]]) -> None:
    """Print the arms' table and each async arm against its agent's sync arm."""
    print(
        f"\n{'agent':<6} {'arm':<5} {'steps':>5} {'train s':>8} {'s/step':>7} {'steps/h':>8} {'trainer wait':>12} "
        f"{'rollouts wait':>13} {'update s':>8} {'RSS GB':>7}  staleness (calls)  stale  untrained  held-out accuracy by step"
    )
    for r in results:
        curve = " ".join(f"{e['step']}:{e['accuracy']:.2f}@{e['train_wall_s']:.0f}s" for e in r["evaluations"])
        print(
            f"{r['agent']:<6} {r['bound']:<5} {r['steps']:>5} {r['train_wall_s']:>8.0f} {r['s_per_step']:>7.1f} "
            f"{r['steps_per_hour']:>8.0f} {r['trainer_wait_share']:>12.0%} {r['rollouts_wait_share']:>13.0%} "
            f"{r['update_s']:>8.1f} {r.get('peak_rss_gb', float('nan')):>7.2f}  {json.dumps(r['staleness']):<17}  {r['stale_calls']:>5}  "
            f"{r['untrained_rollouts']:>9}  {r['accuracy_before']:.2f} -> {curve}"
        )
    print()
    for line in compare([r for r in results if r["round"] == 1]):
        print(line)


def plot(results: list[dict[str, Any]], path: Path) -> None:
    """Held-out accuracy against training wall-clock, one panel per agent, one line per arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    agents = list(dict.fromkeys(r["agent"] for r in results))
    fig, axes = plt.subplots(1, len(agents), figsize=(5.5 * len(agents), 3.6), squeeze=False)
    for ax, agent in zip(axes[0], agents, strict=True):
        for r in results:
            if r["agent"] != agent or r["round"] != 1:
                continue
            xs = [0.0] + [e["train_wall_s"] for e in r["evaluations"]]
            ys = [r["accuracy_before"]] + [e["accuracy"] for e in r["evaluations"]]
            label = "sync" if r["bound"] == "sync" else f"max_staleness={r['bound']}"
            ax.plot(xs, ys, marker="o", label=label)
        ax.set_title(f"{agent} agent")
        ax.set_xlabel("training wall-clock (s, evaluations excluded)")
        ax.set_ylabel("held-out accuracy")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"curve: {path}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny", help="tiny (default: random, measures time only) or smollm2")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--val", type=int, default=16)
    p.add_argument("--val-every", type=int, default=2)
    p.add_argument("--median-s", type=float, default=0.5, help="tail agent: median tool latency (s)")
    p.add_argument("--sigma", type=float, default=1.0, help="tail agent: log-normal sigma (1.0: p99 = 10.2x median)")
    p.add_argument("--agents", nargs="+", default=["tail", "plain"], choices=["tail", "plain"])
    p.add_argument("--bounds", nargs="+", default=["sync", "1", "2"], help="sync and/or max_staleness values")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--watch",
        type=float,
        metavar="SECONDS",
        help="every SECONDS write each arm's engine/scheduler/gateway/store state to <out>/<agent>-<arm>/watch.log, "
        "every 4th time all thread stacks to watch.stacks (to catch a stall; default: off)",
    )
    p.add_argument("--out", default="runs/async_benchmark")
    p.add_argument("--record", type=Path, help="write every arm's figures here as JSON")
    p.add_argument("--plot", type=Path, help="draw held-out accuracy against wall-clock here (PNG)")
    p.add_argument("--report", type=Path, help="print the table (and --plot) from a record; run nothing")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--agent", default="tail", help=argparse.SUPPRESS)
    p.add_argument("--bound", default="sync", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.watch is not None and args.watch <= 0:
        p.error(f"--watch needs a positive number of seconds, got {args.watch:g}")
    if args.child:
        import logging

        logging.basicConfig(level=logging.WARNING)
        print("ARM " + json.dumps(child(args)), flush=True)
        return 0
    if args.report:
        results = json.loads(args.report.read_text())["results"]
        report(results)
        if args.plot:
            plot(results, args.plot)
        return 0
    results = []
    passthrough = [a for a in (sys.argv[1:] if argv is None else argv) if a]
    for round_ in range(args.rounds):
        for agent in args.agents:
            for bound in args.bounds:
                print(f"round {round_ + 1}: {agent} agent, {bound} ...", flush=True)
                done = subprocess.run(
                    [sys.executable, __file__, *passthrough, "--child", "--agent", agent, "--bound", bound],
                    env={**os.environ, **dev_environment(None)},
                    capture_output=True,
                    text=True,
                )
                line = next((x for x in done.stdout.splitlines() if x.startswith("ARM ")), None)
                if line is None:
                    print(f"  failed (exit {done.returncode}):\n{done.stderr[-3000:]}", flush=True)
                    continue
                result = {**json.loads(line[4:]), "round": round_ + 1}
                print("  " + json.dumps(result), flush=True)
                results.append(result)
    report(results)
    if args.plot:
        plot(results, args.plot)
    if args.record:
        args.record.parent.mkdir(parents=True, exist_ok=True)
        record = {
            "benchmark": "benchmarks/async.py",
            "argv": passthrough,
            "commit": subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
            ).stdout.strip(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "cpus": os.cpu_count(),
            "results": results,
        }
        args.record.write_text(json.dumps(record, indent=2) + "\n")
    return 0 if results else 1


if __name__ == "__main__":
    sys.exit(main())
