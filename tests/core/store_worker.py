"""A separate process that works on a store; driven by test_store_processes.py.

    python store_worker.py consume URL WORKER_ID     claim, write spans, finish; print each claim
    python store_worker.py write URL PREFIX          enqueue + spans + lifecycle forever; print acks

Each line is printed (and flushed) only after the store acknowledged the write.
"""

from __future__ import annotations

import asyncio
import sys

from agentbolt import types as t
from agentbolt.store import open_store


async def consume(url: str, worker: str) -> None:
    store = open_store(url)
    print("ready", flush=True)
    idle = 0
    while idle < 3:
        claims = await store.dequeue(worker, limit=4, wait_s=2.0)
        if not claims:
            idle += 1
            continue
        idle = 0
        for c in claims:
            span = t.Span.create("work", rollout_id=c.rollout.rollout_id, attempt_id=c.attempt.attempt_id)
            await store.add_spans([span])
            await store.finish_attempt(c.attempt.attempt_id, t.AttemptStatus.SUCCEEDED, reward=1.0)
            print(f"claimed {c.rollout.rollout_id}", flush=True)
    await store.close()


async def write(url: str, prefix: str) -> None:
    store = open_store(url)
    i = 0
    while True:
        rid = f"{prefix}-{i}"
        await store.enqueue([t.RolloutSpec(rollout_id=rid, input={"i": i})])
        print(f"enqueued {rid}", flush=True)
        spans = [t.Span.create(f"s{k}", rollout_id=rid, attributes={"k": k}) for k in range(20)]
        await store.add_spans(spans)
        print(f"spans {rid} {' '.join(s.span_id for s in spans)}", flush=True)
        (claim,) = await store.dequeue("writer")
        done = await store.finish_attempt(claim.attempt.attempt_id, t.AttemptStatus.SUCCEEDED, reward=float(i))
        print(f"finished {done.rollout_id} {done.final_reward}", flush=True)
        i += 1


if __name__ == "__main__":
    command, url, arg = sys.argv[1:4]
    asyncio.run(consume(url, arg) if command == "consume" else write(url, arg))
