"""Runners in-process and as processes, through the gateway, against the fake backend."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import e2e_agents
import pytest
import pytest_asyncio

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.algorithm import as_tasks
from agentbolt.errors import UserError
from agentbolt.gateway import Gateway
from agentbolt.runners.pool import RunnerPool
from agentbolt.runners.runner import Runner, RunnerConfig, classify_error, load_agent, scope_resources
from agentbolt.store import Store, open_store
from agentbolt.testing.fake_llm import Failure, FakeLLM, FakeLLMServer, FakeTokenizer

TOK = FakeTokenizer()


class World:
    """A store, a fake backend, a gateway and published resources."""

    def __init__(self, store: Store, backend: FakeLLM, server: FakeLLMServer, gateway: Gateway) -> None:
        self.store, self.backend, self.server, self.gateway = store, backend, server, gateway

    async def enqueue(self, items: list[Any], **kw: Any) -> list[str]:
        tasks = as_tasks(items)
        rollouts = await self.store.enqueue(
            [t.RolloutSpec.from_task(task, rollout_id=f"r{task.task_id}", **kw) for task in tasks]
        )
        return [r.rollout_id for r in rollouts]

    async def run(
        self, agent: Any, ids: list[str], *, timeout: float = 60, **config: Any
    ) -> tuple[list[t.Rollout], Runner]:
        runner = Runner(
            agent, self.store, config=RunnerConfig(**{"exit_when_idle_s": 0.5, "dequeue_wait_s": 0.2, **config})
        )
        await asyncio.wait_for(runner.run(), timeout)
        await self.gateway.flush()
        return await self.store.get_rollouts(ids), runner


async def make_world(backend: FakeLLM | None = None, store_url: str = "memory://") -> World:
    store = open_store(store_url)
    backend = backend or FakeLLM(default_reply=lambda req: f"reply to {req.text}")
    server = FakeLLMServer(backend)
    await server.__aenter__()
    gateway = Gateway(store, [server.base_url])
    await gateway.start()
    await store.add_resources(t.Resources(llm=t.LLMEndpoint(base_url=f"{gateway.url}/v1", model="fake-model")))
    return World(store, backend, server, gateway)


@pytest_asyncio.fixture
async def world() -> AsyncIterator[World]:
    w = await make_world()
    yield w
    await w.gateway.stop()
    await w.server.__aexit__(None, None, None)
    await w.store.close()


def llm_spans(spans: list[t.Span]) -> list[t.Span]:
    return [s for s in spans if s.attributes.get(semconv.SPAN_KIND_ATTR) == semconv.KIND_LLM]


async def test_async_agent_success(world: World) -> None:
    ids = await world.enqueue([{"i": i} for i in range(6)])
    rollouts, runner = await world.run(e2e_agents.plain_agent, ids, concurrency=3)
    assert [r.status for r in rollouts] == [t.RolloutStatus.SUCCEEDED] * 6
    assert [r.final_reward for r in rollouts] == [i / 100 for i in range(6)]
    assert runner.stats.succeeded == 6 and runner.stats.failed == 0
    spans = await world.store.query_spans(ids)
    for r in rollouts:
        own = spans[r.rollout_id]
        assert len(llm_spans(own)) == 2  # one per call, the streamed one included
        final = [s for s in own if s.name == semconv.SPAN_REWARD]
        assert len(final) == 1 and final[0].attributes[semconv.REWARD_IS_FINAL] is True
        assert all(s.attempt_id == r.current_attempt_id for s in own)


async def test_sync_agent_emitting_rewards_runs_in_threads(world: World) -> None:
    ids = await world.enqueue([{"i": i} for i in range(5)])
    rollouts, _ = await world.run(e2e_agents.sync_plain_agent, ids, concurrency=5)
    assert [r.final_reward for r in rollouts] == [float(i % 2) for i in range(5)]


async def test_sync_agents_run_concurrently(world: World) -> None:
    active, peak = 0, 0
    lock = threading.Lock()

    def agent(task: Any, resources: t.Resources) -> float:
        nonlocal active, peak
        with lock:
            active += 1
            peak = max(peak, active)
        time.sleep(0.3)
        with lock:
            active -= 1
        return 1.0

    ids = await world.enqueue([{"i": i} for i in range(8)])
    rollouts, _ = await world.run(agent, ids, concurrency=8)
    assert all(r.status is t.RolloutStatus.SUCCEEDED for r in rollouts)
    assert peak == 8  # one thread per slot, not the loop's default pool


async def test_agent_exception_fails_without_retry(world: World) -> None:
    ids = await world.enqueue([{"kind": "raise", "i": 1}], max_attempts=3)
    (rollout,), runner = await world.run(e2e_agents.mixed_agent, ids)
    assert rollout.status is t.RolloutStatus.FAILED and rollout.attempt_count == 1
    assert rollout.error is not None and rollout.error.kind is t.ErrorKind.AGENT
    assert rollout.error.type == "ValueError" and "the tool broke" in rollout.error.message
    assert "raise ValueError" in (rollout.error.traceback or "")
    spans = (await world.store.query_spans(ids))[ids[0]]
    assert any(s.name == semconv.SPAN_EXCEPTION and s.attributes[semconv.EXCEPTION_TYPE] == "ValueError" for s in spans)
    assert runner.stats.errors == {"ValueError": 1}


async def test_hanging_agent_is_cancelled_at_its_timeout(world: World) -> None:
    cancelled = asyncio.Event()

    async def agent(task: Any, resources: t.Resources) -> float:
        try:
            await asyncio.sleep(600)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return 1.0

    ids = await world.enqueue([{"i": 1}], timeout_s=0.5)
    (rollout,), runner = await world.run(agent, ids)
    assert cancelled.is_set()
    assert rollout.status is t.RolloutStatus.FAILED
    assert rollout.error is not None and rollout.error.kind is t.ErrorKind.TIMEOUT
    (attempt,) = await world.store.get_attempts(ids[0])
    assert attempt.status is t.AttemptStatus.TIMED_OUT
    assert runner.stats.ended_by_store == 1


async def test_upstream_failure_is_an_infrastructure_error_and_is_retried() -> None:
    world = await make_world(FakeLLM(failures=[Failure(kind="status", status=500, times=1)]))
    try:
        ids = await world.enqueue([{"kind": "ok", "i": 1}], max_attempts=2)
        (rollout,), _ = await world.run(e2e_agents.mixed_agent, ids)
        assert rollout.status is t.RolloutStatus.SUCCEEDED and rollout.attempt_count == 2
        first, second = await world.store.get_attempts(ids[0])
        assert first.status is t.AttemptStatus.FAILED
        assert first.error is not None and first.error.kind is t.ErrorKind.INFRASTRUCTURE
        assert second.status is t.AttemptStatus.SUCCEEDED
    finally:
        await world.gateway.stop()
        await world.server.__aexit__(None, None, None)


async def test_cancelled_rollout_stops_its_agent(world: World) -> None:
    started = asyncio.Event()

    async def agent(task: Any, resources: t.Resources) -> float:
        started.set()
        await asyncio.sleep(600)
        return 1.0

    ids = await world.enqueue([{"i": 1}])
    runner = Runner(agent, world.store, config=RunnerConfig(lease_s=0.6, exit_when_idle_s=0.5, dequeue_wait_s=0.1))
    task = asyncio.create_task(runner.run())
    await started.wait()
    await world.store.cancel(ids)
    await asyncio.wait_for(task, 20)  # the next heartbeat sees the cancellation
    assert runner.stats.ended_by_store == 1
    (rollout,) = await world.store.get_rollouts(ids)
    assert rollout.status is t.RolloutStatus.CANCELLED


async def test_bad_return_value_is_an_agent_error(world: World) -> None:
    ids = await world.enqueue([{"i": 1}])
    (rollout,), _ = await world.run(lambda task, res: "great", ids)
    assert rollout.status is t.RolloutStatus.FAILED and "finite float reward or None" in rollout.error.message  # type: ignore[union-attr]


async def test_graceful_stop_hands_back_unfinished_work(world: World) -> None:
    async def agent(task: Any, resources: t.Resources) -> float:
        await asyncio.sleep(task["sleep"])
        return 1.0

    ids = await world.enqueue([{"sleep": 0.2}, {"sleep": 600}], max_attempts=3)
    stop = asyncio.Event()
    runner = Runner(agent, world.store, config=RunnerConfig(drain_timeout_s=1.0, dequeue_wait_s=0.1))
    task = asyncio.create_task(runner.run(stop))
    await asyncio.sleep(0.1)
    stop.set()
    stats = await asyncio.wait_for(task, 20)
    quick, slow = await world.store.get_rollouts(ids)
    assert quick.status is t.RolloutStatus.SUCCEEDED  # finished during the drain
    assert slow.status is t.RolloutStatus.QUEUED and slow.error.type == "runner_stopped"  # type: ignore[union-attr]
    assert stats.handed_back == 1


def test_resources_are_scoped_to_the_attempt() -> None:
    res = t.Resources(llm=t.LLMEndpoint(base_url="http://127.0.0.1:9/v1", model="m"))
    scoped = scope_resources(res, "run:eval:task 1:0", "at-1")
    assert scoped.llm.base_url == "http://127.0.0.1:9/rollouts/run%3Aeval%3Atask%201%3A0/attempts/at-1/v1"  # type: ignore[union-attr]
    assert scope_resources(t.Resources(), "r", "a") == t.Resources()


def test_load_agent_forms() -> None:
    assert load_agent("e2e_agents:plain_agent") is e2e_agents.plain_agent

    class WithRollout:
        def rollout(self, task: Any, resources: t.Resources) -> float:
            return 1.0

    assert load_agent(WithRollout()).__name__ == "rollout"
    with pytest.raises(UserError, match="cannot import"):
        load_agent("no_such_module_xyz:agent")
    with pytest.raises(UserError, match="has no attribute"):
        load_agent("e2e_agents:nothing")
    with pytest.raises(UserError, match="module:agent"):
        load_agent("e2e_agents")


def test_classify_error() -> None:
    class APIStatusError(Exception):
        def __init__(self, body: dict[str, Any]) -> None:
            self.body = body

    class APIConnectionError(Exception):
        pass

    assert classify_error(APIStatusError({"type": "agentbolt_upstream_error"})) is t.ErrorKind.INFRASTRUCTURE
    assert classify_error(APIStatusError({"type": "invalid_request_error"})) is t.ErrorKind.AGENT
    wrapped = RuntimeError("chain failed")
    wrapped.__cause__ = APIConnectionError()
    assert classify_error(wrapped) is t.ErrorKind.INFRASTRUCTURE
    assert classify_error(ValueError("bad")) is t.ErrorKind.AGENT


# ------------------------------------------------------------------------------------------------
# Runner processes: the "done when"
# ------------------------------------------------------------------------------------------------


async def holds_rollouts(store: Store, worker_id: str) -> bool:
    """Whether ``worker_id`` holds the running attempt of some rollout now."""
    running = await store.query_rollouts(status=t.RolloutStatus.RUNNING, limit=1000)
    for rollout in running.items:
        attempts = await store.get_attempts(rollout.rollout_id)
        if attempts and attempts[-1].worker_id == worker_id and attempts[-1].status is t.AttemptStatus.RUNNING:
            return True
    return False


async def run_processes(
    tmp_path: Path, items: list[dict[str, Any]], *, kill_after: int | None = None, **rollout_kw: Any
) -> tuple[World, list[t.Rollout], dict[str, list[t.Span]]]:
    world = await make_world(
        FakeLLM(default_reply=lambda req: f"reply to {req.text}", latency_s=0.01), f"sqlite:///{tmp_path / 'runs.db'}"
    )
    ids = await world.enqueue(items, **rollout_kw)
    pool = RunnerPool(
        e2e_agents.plain_agent,
        f"sqlite:///{tmp_path / 'runs.db'}",
        processes=2,
        config=RunnerConfig(concurrency=8, lease_s=2.0),
    )
    pool.start()
    try:
        if kill_after is not None:
            victim = pool.processes[0]
            deadline = time.monotonic() + 120
            # kill only once enough finished *and* the victim holds rollouts (on a loaded machine
            # the other process may have started first and taken everything so far)
            while not (
                (await world.store.count_rollouts())[t.RolloutStatus.SUCCEEDED] >= kill_after
                and await holds_rollouts(world.store, victim.name)
            ):
                assert time.monotonic() < deadline, "the victim runner process never held a rollout"
                await asyncio.sleep(0.02)
            os.kill(victim.pid, signal.SIGKILL)  # type: ignore[arg-type]
        rollouts = await world.store.wait_for_rollouts(ids, timeout=180)
    finally:
        await asyncio.to_thread(pool.stop)
    await world.gateway.flush()
    spans = await world.store.query_spans(ids, latest_attempt_only=True)
    return world, rollouts, spans


async def test_64_rollouts_on_2_processes_x_8(tmp_path: Path) -> None:
    world, rollouts, spans = await run_processes(tmp_path, [{"i": i} for i in range(64)])
    try:
        assert [r.status for r in rollouts] == [t.RolloutStatus.SUCCEEDED] * 64
        assert [r.final_reward for r in rollouts] == [i / 100 for i in range(64)]  # rewards on the right rollouts
        requests = [r for r in world.backend.requests if r.path.endswith("/chat/completions")]
        assert len(requests) == 128
        workers = set()
        for r in rollouts:
            calls = llm_spans(spans[r.rollout_id])
            assert len(calls) == 2  # exactly one span per LLM call
            assert [c.attributes[semconv.LLM_STREAM] for c in calls] == [False, True]
            for call in calls:
                messages = json.loads(call.attributes[semconv.GEN_AI_INPUT_MESSAGES])
                prompt_ids = TOK.render_chat(messages)
                output = json.loads(call.attributes[semconv.GEN_AI_OUTPUT_MESSAGES])[0]["content"]
                assert call.attributes[semconv.PROMPT_TOKEN_IDS] == prompt_ids  # the backend's exact ids
                assert call.attributes[semconv.RESPONSE_TOKEN_IDS] == TOK.encode(output)
                assert call.attributes[semconv.RESPONSE_LOGPROBS] == pytest.approx(
                    TOK.expected_logprobs(prompt_ids, TOK.encode(output))
                )
                assert f"question {r.input['i']}" in messages[0]["content"]  # type: ignore[index]
            workers.add((await world.store.get_attempts(r.rollout_id))[0].worker_id)
        assert len(workers) == 2
    finally:
        await world.gateway.stop()
        await world.server.__aexit__(None, None, None)
        await world.store.close()


async def test_sigkill_of_a_runner_process(tmp_path: Path) -> None:
    world, rollouts, spans = await run_processes(tmp_path, [{"i": i} for i in range(64)], kill_after=8, max_attempts=3)
    try:
        assert [r.status for r in rollouts] == [t.RolloutStatus.SUCCEEDED] * 64
        assert [r.final_reward for r in rollouts] == [i / 100 for i in range(64)]
        retried = [r for r in rollouts if r.attempt_count > 1]
        assert retried, "the killed process held rollouts; they must have been retried"
        for r in retried:
            lost = (await world.store.get_attempts(r.rollout_id))[0]
            assert lost.status is t.AttemptStatus.LOST
            assert len(llm_spans(spans[r.rollout_id])) == 2  # the final attempt's calls only
    finally:
        await world.gateway.stop()
        await world.server.__aexit__(None, None, None)
        await world.store.close()


def test_runner_pool_rejects_a_memory_store() -> None:
    with pytest.raises(UserError, match="memory://"):
        RunnerPool(e2e_agents.plain_agent, "memory://")
