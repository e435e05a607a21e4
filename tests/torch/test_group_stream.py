"""GroupStream (asynchronous training's scheduler) against a real in-memory store: a step that
waits for finished groups is always woken, whatever the interleaving with the store watcher."""

from __future__ import annotations

import asyncio
import random

from agentbolt import types as t
from agentbolt.algorithm import AlgorithmContext
from agentbolt.store.memory import MemoryStore
from agentbolt_torch.training.asynchronous import GroupStream


async def _finish_all(store: MemoryStore, n: int, rng: random.Random) -> None:
    """A runner: claims the rollouts and finishes each after a short random delay."""
    done = 0
    while done < n:
        for claim in await store.dequeue("worker", limit=n, lease_s=30.0, wait_s=0.01):
            await asyncio.sleep(rng.random() * 0.003)
            await store.finish_attempt(claim.attempt.attempt_id, t.AttemptStatus.SUCCEEDED, reward=1.0)
            done += 1


async def _one_take(seed: int) -> list[int]:
    rng = random.Random(seed)
    store = MemoryStore()
    ctx = AlgorithmContext(store=store, gateway=None)  # type: ignore[arg-type]  # the stream never uses it
    tasks = [t.Task(task_id=f"q{i}", input={"i": i}) for i in range(2)]
    stream = GroupStream(ctx, [tasks[:1], tasks[1:]], group_size=1, max_staleness=1, tag="s", poll_s=0.0005)
    runner = asyncio.ensure_future(_finish_all(store, 2, rng))
    await stream.start()
    try:
        await asyncio.sleep(rng.random() * 0.003)
        groups = await asyncio.wait_for(stream.take(2), 10.0)
        return [g.batch for g in groups]
    finally:
        await stream.close()
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        await store.close()


def test_take_is_woken_when_the_last_group_in_flight_finishes() -> None:
    """The watcher once cleared the event take() waits on after moving the last group in
    flight; when take()'s waiter had not started yet, the wake-up was lost and the step waited
    forever (14 of 300 seeds of this scenario hung). Every seed must return both groups, oldest first."""

    async def main() -> None:
        for seed in range(300):
            try:
                batches = await _one_take(seed)
            except TimeoutError:
                raise AssertionError(f"seed {seed}: take() was never woken although both groups finished") from None
            assert batches == [0, 1], (seed, batches)

    asyncio.run(main())
