"""The Runs page's summary cards: a finished run's card (held-out figures and the findings, which
read spans) is computed once, not on every request; a running run's is read afresh each time, so
nothing it shows is stale, and a card computed once equals the one computed afresh."""

from __future__ import annotations

import re
from typing import Any

import httpx

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.store import RunSpec, RunStatus, open_store
from agentbolt.store.base import Store
from agentbolt.testing.store_conformance import llm_span
from agentbolt_dashboard import create_app


async def _evaluate(store: Store, run_id: str, step: int, rewards: list[float]) -> None:
    """One finished held-out evaluation of ``len(rewards)`` questions, and one training group."""
    specs = [
        t.RolloutSpec(rollout_id=f"{run_id}:val{step}:{i}", task_id=f"q{i}", input={"question": f"{i}?"},
                      mode=t.RolloutMode.VAL, run_id=run_id, step=step)
        for i in range(len(rewards))
    ] + [
        t.RolloutSpec(rollout_id=f"{run_id}:step{step}:g:{k}", task_id="g", input={"question": "g?"},
                      group_id=f"{run_id}:step{step}:g", run_id=run_id, step=step)
        for k in range(2)
    ]  # fmt: skip
    await store.enqueue(specs)
    claims = await store.dequeue("w", limit=len(specs))
    by_id = {c.rollout.rollout_id: c for c in claims}
    for spec, reward in zip(specs, [*rewards, 0.0, 1.0], strict=True):
        claim = by_id[spec.rollout_id]
        await store.add_spans([llm_span(spec.rollout_id, claim.attempt.attempt_id, **{semconv.TOKEN_SOURCE: "exact"})])
        await store.finish_attempt(claim.attempt.attempt_id, t.AttemptStatus.SUCCEEDED, reward=reward)
    await store.add_run_metrics(run_id, step, {"train/reward": 0.5})


def _heldout(page: str, run_id: str) -> str:
    row = re.search(rf'<tr data-run="{re.escape(run_id)}">.*?</tr>', page, re.S)
    assert row is not None, run_id
    cell = re.search(r'data-field="heldout">(.*?)</td>', row.group(0), re.S)
    assert cell is not None
    return " ".join(re.sub(r"<[^>]+>", " ", cell.group(1)).split())


async def test_a_finished_runs_card_is_read_once_and_a_running_runs_every_time() -> None:
    store = open_store("memory://", sweep_interval_s=0)
    read: list[str] = []
    query_spans = store.query_spans

    async def counting(rollout_ids: Any, **kw: Any) -> Any:  # the real store, its reads recorded
        read.extend(rollout_ids)
        return await query_spans(rollout_ids, **kw)

    try:
        config = {"success_threshold": 1.0}
        done = await store.start_run(RunSpec(name="done", algorithm="torch-grpo", config=config))
        await _evaluate(store, done.run_id, 0, [0.0, 1.0])
        await store.finish_run(done.run_id, RunStatus.SUCCEEDED)
        live = await store.start_run(RunSpec(name="live", algorithm="torch-grpo", config=config))
        await _evaluate(store, live.run_id, 0, [0.0, 0.0])
        cut = await store.start_run(RunSpec(name="cut", algorithm="torch-grpo", config=config))
        await _evaluate(store, cut.run_id, 0, [1.0])
        straggler = f"{cut.run_id}:val0:9"  # ended with a held-out rollout still queued
        await store.enqueue(
            [t.RolloutSpec(rollout_id=straggler, task_id="q9", mode=t.RolloutMode.VAL, run_id=cut.run_id, step=0)]
        )
        await store.finish_run(cut.run_id, RunStatus.FAILED, error="killed")
        store.query_spans = counting  # type: ignore[method-assign]
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(store)), base_url="http://d") as c:
            first = (await c.get("/runs")).text
            assert {r.split(":")[0] for r in read} == {done.run_id, live.run_id, cut.run_id}  # findings read spans
            assert "n=1" in _heldout(first, cut.run_id)
            read.clear()
            (claim,) = await store.dequeue("w", limit=1)
            assert claim.rollout.rollout_id == straggler
            await store.finish_attempt(claim.attempt.attempt_id, t.AttemptStatus.SUCCEEDED, reward=0.0)
            await _evaluate(store, live.run_id, 1, [1.0, 1.0])
            second = (await c.get("/runs")).text
            # the finished run's card is kept; the run that ended with a rollout unfinished is read again
            assert {r.split(":")[0] for r in read} == {live.run_id, cut.run_id}
            assert "0.500" in _heldout(second, cut.run_id) and "n=2" in _heldout(second, cut.run_id)
            assert _heldout(second, done.run_id) == _heldout(first, done.run_id)
            assert "0.000 → 1.000" in _heldout(second, live.run_id)  # the running run's new evaluation shows
            await store.finish_run(live.run_id, RunStatus.SUCCEEDED)
            read.clear()
            third = (await c.get("/runs")).text
            assert {r.split(":")[0] for r in read} == {live.run_id}  # just finished: read once more, then kept
            read.clear()
            fourth = (await c.get("/runs")).text
            assert not read and fourth == third
        fresh = create_app(store)  # a card kept equals one computed afresh
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=fresh), base_url="http://d") as c:
            assert (await c.get("/runs")).text == fourth
    finally:
        await store.close()
