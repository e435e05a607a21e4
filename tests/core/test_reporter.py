"""The runner's writer: attempt ends go with their spans, in shared transactions."""

from __future__ import annotations

import asyncio

import pytest

from agentbolt import types as t
from agentbolt.errors import StaleAttemptError
from agentbolt.runners.reporter import Reporter
from agentbolt.store import Store, open_store


async def _claimed(store: Store, n: int) -> list[t.Claim]:
    await store.enqueue([t.RolloutSpec(rollout_id=f"r{i}") for i in range(n)])
    return await store.dequeue("w", limit=n)


@pytest.mark.parametrize("url", ["memory://", "sqlite"])
async def test_ends_that_come_together_share_one_transaction_with_their_spans(url: str, tmp_path: object) -> None:
    store = open_store(url if url == "memory://" else f"sqlite:///{tmp_path}/s.db")
    claims = await _claimed(store, 3)
    reporter = Reporter(store, interval_s=60)  # nothing is written for the batching delay alone
    reporter.start()
    for c in claims:
        for k in range(4):
            reporter.put(t.Span.create(f"s{k}", rollout_id=c.rollout.rollout_id, attempt_id=c.attempt.attempt_id))
    ends = [
        reporter.finish(c.attempt.attempt_id, t.AttemptStatus.SUCCEEDED, reward=float(i)) for i, c in enumerate(claims)
    ]
    rollouts = await asyncio.gather(*ends)
    assert [r.final_reward for r in rollouts] == [0.0, 1.0, 2.0]
    assert (reporter.batches, reporter.ends) == (1, 3)
    spans = await store.query_spans([c.rollout.rollout_id for c in claims])
    assert all(len(v) == 4 for v in spans.values())
    await reporter.close()
    await store.close()


async def test_a_refused_end_fails_alone() -> None:
    store = open_store("memory://")
    c0, c1 = await _claimed(store, 2)
    await store.cancel(["r1"], reason="step abandoned")
    reporter = Reporter(store, interval_s=60)
    reporter.start()
    reporter.put(t.Span.create("kept", rollout_id="r0", attempt_id=c0.attempt.attempt_id))
    reporter.put(t.Span.create("kept too", rollout_id="r1", attempt_id=c1.attempt.attempt_id))
    ok, refused = await asyncio.gather(
        reporter.finish(c0.attempt.attempt_id, t.AttemptStatus.SUCCEEDED, reward=1.0),
        reporter.finish(c1.attempt.attempt_id, t.AttemptStatus.SUCCEEDED, reward=1.0),
        return_exceptions=True,
    )
    assert isinstance(ok, t.Rollout) and ok.status is t.RolloutStatus.SUCCEEDED
    assert isinstance(refused, StaleAttemptError) and "step abandoned" in str(refused)
    spans = await store.query_spans(["r0", "r1"])
    assert [s.name for s in spans["r0"]] == ["kept"] and [s.name for s in spans["r1"]] == ["kept too"]
    await reporter.close()
    await store.close()


async def test_an_end_waits_for_the_spans_queued_before_it() -> None:
    store = open_store("memory://")
    (claim,) = await _claimed(store, 1)
    reporter = Reporter(store, batch_size=2, interval_s=60)  # five spans: three batches
    reporter.start()
    for k in range(5):
        reporter.put(t.Span.create(f"s{k}", rollout_id="r0", attempt_id=claim.attempt.attempt_id))
    rollout = await reporter.finish(claim.attempt.attempt_id, t.AttemptStatus.SUCCEEDED)
    assert rollout.status is t.RolloutStatus.SUCCEEDED
    assert [s.name for s in (await store.query_spans(["r0"]))["r0"]] == [f"s{k}" for k in range(5)]
    assert reporter.batches == 1  # the end went with the last batch, not the first
    await reporter.close()
    await store.close()
