"""Conformance tests for the runs part of the store protocol
(:class:`~agentbolt.store.run_protocol.RunStore`). :class:`~agentbolt.testing.store_conformance.StoreConformance`
includes them, so every backend runs them."""

from __future__ import annotations

import pytest

from .. import types as t
from ..errors import ConflictError, InvalidTransitionError, NotFoundError, SchemaError, UserError
from ..store.base import Store
from ..store.run_records import RolloutSearch, RunSpec, RunStatus

__all__ = ["RunStoreConformance"]


@pytest.mark.asyncio
class RunStoreConformance:
    """Runs, metrics, rollout search and health: behaviour every backend shares."""

    async def test_run_lifecycle(self, store: Store) -> None:
        spec = RunSpec(name="gsm8k", algorithm="torch-grpo", model="tiny", config={"lr": 1e-5, "steps": 2})
        run = await store.start_run(spec)
        assert run.run_id.startswith("run-") and run.status is RunStatus.RUNNING and run.ended_at is None
        assert run.config == {"lr": 1e-5, "steps": 2} and run.steps == 0 and run.latest == {}
        assert await store.get_run(run.run_id) == run
        done = await store.finish_run(run.run_id, RunStatus.SUCCEEDED)
        assert done.status is RunStatus.SUCCEEDED and done.ended_at is not None
        assert (await store.get_run(run.run_id)).status is RunStatus.SUCCEEDED
        with pytest.raises(InvalidTransitionError):
            await store.finish_run(run.run_id, RunStatus.FAILED)
        failed = await store.start_run(RunSpec(run_id="run-b", algorithm="evaluate"))
        failed = await store.finish_run("run-b", RunStatus.FAILED, error="ValueError: boom")
        assert failed.error == "ValueError: boom"

    async def test_run_errors(self, store: Store) -> None:
        await store.start_run(RunSpec(run_id="run-x", algorithm="a"))
        with pytest.raises(ConflictError):
            await store.start_run(RunSpec(run_id="run-x", algorithm="a"))
        for call in (
            store.get_run("nope"),
            store.finish_run("nope", RunStatus.SUCCEEDED),
            store.add_run_metrics("nope", 1, {"a": 1.0}),
            store.get_run_metrics("nope"),
        ):
            with pytest.raises(NotFoundError):
                await call
        with pytest.raises(UserError):
            await store.finish_run("run-x", RunStatus.RUNNING)
        with pytest.raises(SchemaError):
            await store.add_run_metrics("run-x", 1, {"loss": float("nan")})
        with pytest.raises(UserError):
            await store.list_runs(limit=0)

    async def test_runs_are_listed_newest_first(self, store: Store) -> None:
        for i in range(3):
            await store.start_run(RunSpec(run_id=f"run-{i}", algorithm="a"))
        assert [r.run_id for r in await store.list_runs()] == ["run-2", "run-1", "run-0"]
        assert [r.run_id for r in await store.list_runs(limit=2)] == ["run-2", "run-1"]

    async def test_metrics_per_step_and_polling(self, store: Store) -> None:
        run = await store.start_run(RunSpec(algorithm="a"))
        first = await store.add_run_metrics(run.run_id, 0, {"val/reward": 0.25})
        await store.add_run_metrics(run.run_id, 1, {"train/reward": 0.5, "update/loss": 1.5})
        await store.add_run_metrics(run.run_id, 1, {"val/reward": 0.75})
        rows = await store.get_run_metrics(run.run_id)
        assert [(m.step, m.values) for m in rows] == [
            (0, {"val/reward": 0.25}),
            (1, {"train/reward": 0.5, "update/loss": 1.5}),
            (1, {"val/reward": 0.75}),
        ]
        assert rows[0].seq == first.seq and rows[0].seq < rows[1].seq < rows[2].seq
        newer = await store.get_run_metrics(run.run_id, after_seq=rows[1].seq)
        assert [m.values for m in newer] == [{"val/reward": 0.75}]
        assert await store.get_run_metrics(run.run_id, after_seq=rows[2].seq) == []
        got = await store.get_run(run.run_id)
        assert got.steps == 1
        assert got.latest == {"val/reward": 0.75, "train/reward": 0.5, "update/loss": 1.5}

    async def test_rollouts_carry_run_and_step(self, store: Store) -> None:
        spec = t.RolloutSpec(rollout_id="r1", task_id="t", input={"q": 1}, run_id="run-a", step=3)
        (r,) = await store.enqueue([spec])
        assert (r.run_id, r.step) == ("run-a", 3)
        (got,) = await store.get_rollouts(["r1"])
        assert (got.run_id, got.step) == ("run-a", 3)
        assert (await store.enqueue([spec]))[0] == got  # idempotent with the run fields
        with pytest.raises(ConflictError):
            await store.enqueue([spec.model_copy(update={"step": 4})])

    async def test_search_rollouts(self, store: Store) -> None:
        specs = [
            t.RolloutSpec(
                rollout_id=f"a{i}", task_id=f"add-{i}", input={"question": f"What is {i}+1?"}, run_id="A", step=i % 2
            )
            for i in range(6)
        ] + [t.RolloutSpec(rollout_id="b0", task_id="other", input={"question": "Capital?"}, run_id="B", step=0)]
        await store.enqueue(specs)
        claims = await store.dequeue("w1", limit=7)
        by_id = {c.rollout.rollout_id: c.attempt.attempt_id for c in claims}
        for i in range(4):
            await store.finish_attempt(by_id[f"a{i}"], t.AttemptStatus.SUCCEEDED, reward=i / 4)
        err = t.ErrorInfo(kind=t.ErrorKind.AGENT, type="ValueError", message="bad")
        await store.finish_attempt(by_id["a4"], t.AttemptStatus.FAILED, error=err)

        async def ids(**kw: object) -> list[str]:
            page = await store.search_rollouts(RolloutSearch(**kw))
            assert page.total >= len(page.items)
            return [r.rollout_id for r in page.items]

        assert await ids(run_id="A") == ["a5", "a4", "a3", "a2", "a1", "a0"]  # newest first
        assert await ids(run_id="A", step=1) == ["a5", "a3", "a1"]
        assert await ids(run_id="A", status=[t.RolloutStatus.SUCCEEDED]) == ["a3", "a2", "a1", "a0"]
        assert await ids(reward_min=0.25, reward_max=0.5) == ["a2", "a1"]
        assert await ids(failure_kind=t.ErrorKind.AGENT) == ["a4"]
        assert await ids(text="CAPITAL") == ["b0"]
        assert await ids(text="add-3") == ["a3"]
        assert await ids(text="100%_") == []
        page = await store.search_rollouts(RolloutSearch(run_id="A", limit=4, offset=4))
        assert [r.rollout_id for r in page.items] == ["a1", "a0"] and page.total == 6

    async def test_store_health(self, store: Store) -> None:
        await store.enqueue([t.RolloutSpec(rollout_id=f"h{i}", max_attempts=3) for i in range(4)])
        claims = await store.dequeue("runner-1", limit=2)
        infra = t.ErrorInfo(kind=t.ErrorKind.INFRASTRUCTURE, type="Lost", message="gateway down")
        await store.finish_attempt(claims[0].attempt.attempt_id, t.AttemptStatus.FAILED, error=infra)  # requeued
        agent = t.ErrorInfo(kind=t.ErrorKind.AGENT, type="ValueError", message="bad")
        await store.finish_attempt(claims[1].attempt.attempt_id, t.AttemptStatus.FAILED, error=agent)
        (again,) = await store.dequeue("runner-2", limit=1)
        health = await store.store_health()
        assert health.rollouts[t.RolloutStatus.QUEUED] == 2
        assert health.rollouts[t.RolloutStatus.RUNNING] == 1
        assert health.rollouts[t.RolloutStatus.FAILED] == 1
        assert health.attempts[t.AttemptStatus.RUNNING] == 1
        assert health.attempts[t.AttemptStatus.FAILED] == 2
        assert health.failures == {"agent": 1}
        assert again.rollout.rollout_id == claims[0].rollout.rollout_id
        assert (health.retried_rollouts, health.retries) == (1, 1)
        assert sorted(r.worker_id for r in health.runners) == ["runner-1", "runner-2"]
        running = {r.worker_id: r.running for r in health.runners}
        assert running == {"runner-1": 0, "runner-2": 1}
