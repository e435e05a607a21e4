"""What making an answered call durable costs the gateway, per call, in CPU time of its thread.

Run:  uv run python benchmarks/call_log.py [--calls 2000] [--rounds 10] [--record PATH]

One process, no network: the cost of the step itself, measured with the thread's CPU clock, so
other jobs on a shared machine (which make latency figures swing by tens of ms) barely move it.
Each round measures every arm on ``--calls`` calls, arms alternating; medians over rounds:

- ``span``: build the call's span (every arm pays this, durable or not);
- ``call_log``: build it and append it to the gateway's call log (what an answer waits for with
  ``--call-log``, the default);
- ``commit_1``: build it and commit it to a SQLite store alone (what an answer waits for with
  ``--call-log none`` when it is the only call waiting);
- ``commit_16``: 16 calls' spans committed in one transaction (group commit), per call.

The spans are those of a chat completion with exact token ids and logprobs, as the gateway
records them from a vLLM-style upstream.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from bench_record import load_average, write_record

from agentbolt import types as t
from agentbolt.gateway.call_log import CallLog
from agentbolt.gateway.recorder import CallRecord, build_span
from agentbolt.store import open_store

REQUEST = {
    "model": "fake-model",
    "messages": [{"role": "user", "content": "What is 6 times 7?"}],
    "max_tokens": 16,
    "return_token_ids": True,
    "logprobs": True,
}
RESPONSE = {
    "id": "chatcmpl-0",
    "object": "chat.completion",
    "model": "fake-model",
    "prompt_token_ids": list(range(100, 112)),
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "The answer is 42."},
            "finish_reason": "stop",
            "token_ids": list(range(200, 206)),
            "logprobs": {"content": [{"token": "x", "logprob": -0.25, "top_logprobs": []} for _ in range(6)]},
        }
    ],
    "usage": {"prompt_tokens": 12, "completion_tokens": 6, "total_tokens": 18},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=2000, help="calls per arm per round")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--record", type=Path, help="write the figures as JSON here")
    args = ap.parse_args()
    load_start = load_average()
    with tempfile.TemporaryDirectory(prefix="agentbolt-calllog-") as tmp:
        rows = asyncio.run(measure(Path(tmp), args.calls, args.rounds))
    print(f"durable-call cost per call ({args.calls} calls x {args.rounds} rounds; thread CPU time, medians)")
    for name, row in rows.items():
        print(f"{name:>10}: {row['cpu_us']:8.1f} us CPU  {row['wall_us']:8.1f} us wall")
    if args.record is not None:
        write_record(args.record, "benchmarks/call_log.py", load_start, arms=rows)


async def measure(tmp: Path, calls: int, rounds: int) -> dict[str, dict[str, Any]]:
    store = open_store(f"sqlite:///{tmp / 'store.db'}")
    await store.enqueue([t.RolloutSpec(rollout_id=f"r{i}") for i in range(64)])
    attempts = [(c.rollout.rollout_id, c.attempt.attempt_id) for c in await store.dequeue("bench", limit=64)]
    log = CallLog(tmp / "calls")
    log.open()
    counter = 0

    def span() -> t.Span:
        nonlocal counter
        counter += 1
        rollout_id, attempt_id = attempts[counter % len(attempts)]
        now = time.time_ns()
        record = CallRecord(rollout_id, attempt_id, "chat", REQUEST, "http://upstream/v1", now - 50_000_000, now)
        record.response, record.status = {**RESPONSE, "id": f"chatcmpl-{counter}"}, 200
        return build_span(record, span_id=f"{counter:016x}")

    async def build_only() -> None:
        for _ in range(calls):
            span()

    async def call_log() -> None:
        for _ in range(calls):
            log.append(span(), counter)
        log.release(counter)

    async def commit_1() -> None:
        for _ in range(calls):
            await store.add_spans([span()])

    async def commit_16() -> None:
        for _ in range(calls // 16):
            await store.add_spans([span() for _ in range(16)])

    arms: dict[str, tuple[Callable[[], Coroutine[Any, Any, None]], int]] = {
        "span": (build_only, calls),
        "call_log": (call_log, calls),
        "commit_1": (commit_1, calls),
        "commit_16": (commit_16, calls // 16 * 16),
    }
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in arms}
    for _ in range(rounds):
        for name, (run, n) in arms.items():
            cpu, wall = time.thread_time_ns(), time.perf_counter_ns()
            await run()
            results[name].append(((time.thread_time_ns() - cpu) / n / 1e3, (time.perf_counter_ns() - wall) / n / 1e3))
    log.close()
    await store.close()
    return {
        name: {
            "cpu_us": round(statistics.median(c for c, _ in values), 1),
            "wall_us": round(statistics.median(w for _, w in values), 1),
            "rounds_cpu_us": [round(c, 1) for c, _ in values],
        }
        for name, values in results.items()
    }


if __name__ == "__main__":
    main()
