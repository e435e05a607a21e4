"""The monitoring snapshots: ``GenerationEngine.state()``, ``GroupStream.state()`` and
``TorchGRPO.state()`` report what is queued, generating, paused and in flight (tiny model, real
in-memory store)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from agentbolt import types as t
from agentbolt.algorithm import AlgorithmContext
from agentbolt.options import RunnerOptions
from agentbolt.store.memory import MemoryStore
from agentbolt.trainer import Trainer
from agentbolt_torch.generation.engine import GenerationEngine, SamplingParams
from agentbolt_torch.policy import Policy
from agentbolt_torch.training.algorithm import TorchGRPO
from agentbolt_torch.training.asynchronous import GroupStream

LONG = SamplingParams(max_tokens=900, ignore_eos=True)
"""Far more decode steps than it takes this test to pause the engine after admission."""


def _wait_admitted(handle: Any) -> None:
    deadline = time.monotonic() + 60
    while handle.policy_version is None:
        assert time.monotonic() < deadline, "the request was never admitted"
        time.sleep(0.002)


def test_engine_state_shows_a_queued_request_behind_a_paused_engine(fp32_policy: Policy) -> None:
    prompt = fp32_policy.tokenizer("queued")["input_ids"]
    with GenerationEngine(fp32_policy, batch_window_s=0) as engine:
        idle = engine.state()
        assert idle["queued"] == 0 and idle["active_rows"] == 0 and idle["running"] and not idle["paused"]
        assert idle["oldest_queued_s"] is None and idle["oldest_active_s"] is None
        engine.pause(timeout=60)
        try:
            handle = engine.submit(prompt, SamplingParams(max_tokens=2), n=3)
            state = engine.state()
            assert state["paused"] and state["parked"] and not state["frozen"]
            assert state["queued"] == 1 and state["queued_sequences"] == 3 and state["oldest_queued_s"] >= 0
            assert state["active_rows"] == 0
            json.dumps(state)
        finally:
            engine.resume()
        assert len(handle.wait(60)) == 3
        done = engine.state()
        assert done["queued"] == 0 and not done["paused"] and done["decode_steps"] >= 1
    assert not engine.state()["running"]


def test_engine_state_shows_the_rows_generating_and_a_frozen_engine(fp32_policy: Policy) -> None:
    prompt = fp32_policy.tokenizer("active")["input_ids"]
    with GenerationEngine(fp32_policy, batch_window_s=0) as engine:
        for _ in range(5):  # retried only if the request finished before the pause (it never should)
            handle = engine.submit(prompt, LONG, n=2)
            _wait_admitted(handle)
            engine.pause(drain=False, timeout=60)  # suspended between two decode steps
            if not handle.done:
                break
            engine.resume()
        try:
            state = engine.state()
            assert state["paused"] and state["frozen"] and state["parked"]
            assert state["active_rows"] == 2 and state["active_requests"] == 1 and state["queued"] == 0
            assert state["oldest_active_tokens"] >= 1 and state["oldest_active_s"] >= 0
            assert state["served_version"] == fp32_policy.version
            json.dumps(state)
        finally:
            handle.cancel()
            engine.resume()
        handle.wait(60)
        assert engine.state()["active_rows"] == 0


async def _finish(store: MemoryStore, n: int) -> None:
    """A runner: claims ``n`` rollouts (oldest first) and finishes them."""
    claims = await store.dequeue("worker", limit=n, lease_s=30.0, wait_s=0.01)
    assert len(claims) == n
    for claim in claims:
        await store.finish_attempt(claim.attempt.attempt_id, t.AttemptStatus.SUCCEEDED, reward=1.0)


def test_group_stream_state_counts_groups_in_flight_ready_and_held() -> None:
    async def main() -> None:
        store = MemoryStore()
        ctx = AlgorithmContext(store=store, gateway=None)  # type: ignore[arg-type]  # the stream never uses it
        data = [[t.Task(task_id=f"q{b}", input={"b": b})] for b in range(3)]
        stream = GroupStream(ctx, data, group_size=2, max_staleness=1, tag="s", poll_s=0.001)
        await stream.start()
        try:
            state = stream.state()
            assert state["next_batch"] == 2 and state["batches"] == 3 and state["finished_steps"] == 0
            assert state["in_flight"] == 2 and state["in_flight_rollouts"] == 4
            assert state["in_flight_batches"] == [0, 1] and state["ready"] == 0 and not state["held"]
            await _finish(store, 2)  # batch 0's group
            assert [g.batch for g in await asyncio.wait_for(stream.take(1), 30)] == [0]
            await stream.step_done()  # the bound now admits batch 2
            state = stream.state()
            assert state["finished_steps"] == 1 and state["next_batch"] == 3
            assert state["in_flight"] == 2 and state["in_flight_batches"] == [1, 2] and state["ready"] == 0
            await _finish(store, 4)
            await asyncio.wait_for(stream.settle(), 30)
            state = stream.state()
            assert state["held"] and state["in_flight"] == 0 and state["in_flight_batches"] == []
            assert state["ready"] == 2
            json.dumps(state)
        finally:
            await stream.close()
            await store.close()

    asyncio.run(main())


def test_torch_grpo_state_reports_engine_and_stream_while_training_asynchronously(tmp_path: Any) -> None:
    snapshots: list[dict[str, Any]] = []
    algorithm = TorchGRPO(
        "tiny",
        steps=2,
        batch_size=2,
        group_size=2,
        sampling={"max_tokens": 4},
        evaluation={"every": None, "before": False},
        policy={"autocast": None},
        output={"out_dir": tmp_path, "plot": False},
    )
    assert algorithm.state() == {"engine": None, "stream": None}

    async def agent(task: dict[str, Any], resources: t.Resources) -> float:
        import openai

        assert resources.llm is not None
        client = openai.AsyncOpenAI(base_url=resources.llm.base_url, api_key="none", max_retries=0)
        reply = await client.chat.completions.create(
            model=resources.llm.model, messages=[{"role": "user", "content": task["question"]}]
        )
        snapshots.append(json.loads(json.dumps(algorithm.state())))  # what a monitor sees mid-run
        return float(len(reply.choices[0].message.content or "") % 2)

    trainer = Trainer(agent, algorithm, store="memory://", runners=RunnerOptions(n=0, concurrency=4), progress=False)
    trainer.fit([{"task_id": f"q{i}", "question": f"{i} + {i}?"} for i in range(4)], max_staleness=1)
    assert len(snapshots) == 8
    assert all(s["engine"]["running"] and s["stream"]["batches"] == 2 for s in snapshots)
    assert all(s["stream"]["in_flight"] >= 1 for s in snapshots)  # the group of the rollout that looked
    assert algorithm.state() == {"engine": None, "stream": None}  # the run is over
