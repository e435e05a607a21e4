"""Runners as Ray actors on a real local Ray cluster (2 CPUs, 127.0.0.1): rollouts through the
store server, an actor killed mid-rollout, a training step of the tiny model, URL checks."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import e2e_agents
import pytest
from test_runner import holds_rollouts, llm_spans, make_world

from agentbolt import types as t
from agentbolt.errors import UserError
from agentbolt.options import RunnerOptions
from agentbolt.runners.ray import (
    RayRunnerPool,
    RayWorkerOptions,
    RunnerWorker,
    check_urls_for_cluster,
    options_from_mapping,
    parse_resources,
)
from agentbolt.runners.runner import RunnerConfig
from agentbolt.store.server import ServerThread
from agentbolt.testing.fake_llm import FakeLLM

# Under `uv run`, Ray would start its workers with `uv run` again; read when Ray is first imported.
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
ray = pytest.importorskip("ray")

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    """One local Ray cluster for this module: 2 CPUs, 127.0.0.1, no dashboard."""
    monkey = pytest.MonkeyPatch()
    monkey.setenv("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(address="local", num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1")
    try:
        yield
    finally:
        ray.shutdown()
        monkey.undo()


async def run_on_ray(
    tmp_path: Path, n: int, *, kill: bool = False, workers: int = 2
) -> tuple[Any, list[t.Rollout], dict[str, list[t.Span]], RayRunnerPool, str | None]:
    """``n`` rollouts of the plain agent on ``workers`` Ray actors talking to a store server
    (SQLite behind it); with ``kill``, actor 0 is killed by Ray (and restarted) mid-rollout."""
    world = await make_world(
        FakeLLM(default_reply=lambda req: f"reply to {req.text}", latency_s=0.01), f"sqlite:///{tmp_path / 'runs.db'}"
    )
    server = ServerThread(world.store)
    server.start()
    pool = RayRunnerPool(
        e2e_agents.plain_agent,
        server.url,
        workers=workers,
        config=RunnerConfig(concurrency=8, lease_s=2.0),
        options=RayWorkerOptions(num_cpus=0.5),
    )
    victim: str | None = None
    try:
        await asyncio.to_thread(pool.start)
        await asyncio.to_thread(pool.wait_ready, 120)
        # enqueue once every actor is claiming: rollouts queued earlier all went to the actor that
        # was ready first when the machine was loaded (the other one then ran none)
        ids = await world.enqueue([{"i": i} for i in range(n)], max_attempts=3)
        if kill:
            victim = (await asyncio.to_thread(pool.status))[0].worker_id
            assert victim is not None
            deadline = time.monotonic() + 120
            while not (
                (await world.store.count_rollouts())[t.RolloutStatus.SUCCEEDED] >= 8
                and await holds_rollouts(world.store, victim)
            ):
                assert time.monotonic() < deadline, "the victim actor never held a rollout"
                await asyncio.sleep(0.02)
            ray.kill(pool.actors[0], no_restart=False)  # Ray restarts it
        rollouts = await world.store.wait_for_rollouts(ids, timeout=180)
        if kill:  # the replacement answers with a new process
            deadline = time.monotonic() + 60
            while (await asyncio.to_thread(pool.status))[0].restarts_seen == 0:
                assert time.monotonic() < deadline, "the killed actor was not restarted"
                await asyncio.sleep(0.5)
    finally:
        await asyncio.to_thread(pool.stop)
        server.stop()
    await world.gateway.flush()
    spans = await world.store.query_spans(ids, latest_attempt_only=True)
    return world, rollouts, spans, pool, victim


async def close(world: Any) -> None:
    await world.gateway.stop()
    await world.server.__aexit__(None, None, None)
    await world.store.close()


@pytest.mark.usefixtures("ray_cluster")
async def test_rollouts_on_two_ray_actors_through_the_store_server(tmp_path: Path) -> None:
    world, rollouts, spans, _pool, _ = await run_on_ray(tmp_path, 24)
    try:
        assert [r.status for r in rollouts] == [t.RolloutStatus.SUCCEEDED] * 24
        assert [r.final_reward for r in rollouts] == [i / 100 for i in range(24)]
        workers = set()
        for r in rollouts:
            assert len(llm_spans(spans[r.rollout_id])) == 2
            workers.add((await world.store.get_attempts(r.rollout_id))[0].worker_id)
        assert len(workers) == 2 and all(w.startswith("ray-runner-") for w in workers)
    finally:
        await close(world)


@pytest.mark.usefixtures("ray_cluster")
async def test_killed_actor_is_restarted_and_its_rollouts_retried(tmp_path: Path) -> None:
    world, rollouts, spans, pool, victim = await run_on_ray(tmp_path, 48, kill=True)
    try:
        # nothing lost: every rollout terminal, succeeded, with the reward of its own task
        assert [r.status for r in rollouts] == [t.RolloutStatus.SUCCEEDED] * 48
        assert [r.final_reward for r in rollouts] == [i / 100 for i in range(48)]
        retried = [r for r in rollouts if r.attempt_count > 1]
        assert retried, "the killed actor held rollouts; they must have been retried"
        for r in rollouts:
            attempts = await world.store.get_attempts(r.rollout_id)
            # nothing duplicated: exactly one successful attempt, and only its calls are kept
            assert [a.status for a in attempts].count(t.AttemptStatus.SUCCEEDED) == 1
            assert len(llm_spans(spans[r.rollout_id])) == 2
        for r in retried:
            first = (await world.store.get_attempts(r.rollout_id))[0]
            assert first.status is t.AttemptStatus.LOST and first.worker_id == victim
        assert pool.actors == []  # stopped
    finally:
        await close(world)


@pytest.mark.usefixtures("ray_cluster")
def test_a_training_step_of_the_tiny_model_with_ray_runners(tmp_path: Path) -> None:
    pytest.importorskip("agentbolt_torch")
    from agentbolt.trainer import Trainer
    from agentbolt_torch.training.algorithm import TorchGRPO

    tasks = [{"task_id": f"q{i}", "question": f"What is {i} + {i}?"} for i in range(4)]
    algorithm = TorchGRPO(
        "tiny",
        steps=1,
        batch_size=2,
        group_size=4,
        sampling={"max_tokens": 8},
        evaluation={"every": None},
        generation={"engine": {"batch_window_s": 0.01}},
        output={"out_dir": tmp_path / "out"},
        update={"lr": 1e-2},
    )
    trainer = Trainer(
        e2e_agents.parity_agent,
        algorithm,
        store=f"sqlite:///{tmp_path}/runs.db",  # allowed: every node of this cluster is this machine
        runners=RunnerOptions(n=2, concurrency=4, kind="ray", ray_options={"num_cpus": 0.5}),
        progress=False,
    )
    result = trainer.fit(tasks[:2], tasks[2:])
    assert result.steps == 1 and result.policy_version == 1
    update = [h for h in result.history if "update/loss" in h]
    assert update and update[0]["update/n_transitions"] == 8
    assert update[0]["lightningrl/trained_calls"] == 8  # every call recorded with exact token ids


def test_urls_the_workers_cannot_use_are_refused() -> None:
    with pytest.raises(UserError, match="memory://"):
        RayRunnerPool(e2e_agents.plain_agent, "memory://")
    check_urls_for_cluster("sqlite:///x.db", cluster_is_local=True)  # one machine: fine
    with pytest.raises(UserError, match="SQLite file on this machine"):
        check_urls_for_cluster("sqlite:///x.db", cluster_is_local=False)
    with pytest.raises(UserError, match="loopback"):
        check_urls_for_cluster("http://127.0.0.1:4747", cluster_is_local=False)
    with pytest.raises(UserError, match="gateway"):
        check_urls_for_cluster("postgresql://10.0.0.5/db", cluster_is_local=False, gateway_host="127.0.0.1")
    check_urls_for_cluster("postgresql://10.0.0.5/db", cluster_is_local=False, gateway_host="10.0.0.1")
    with pytest.raises(UserError, match="num_cpus"):
        RayWorkerOptions(num_cpus=-1)
    from agentbolt.trainer import Trainer

    with pytest.raises(UserError, match=r"invalid RunnerOptions:\n  kind: Input should be 'processes' or 'ray'"):
        Trainer(
            e2e_agents.plain_agent,
            runners=RunnerOptions(kind="kubernetes"),
        )


def test_worker_reports_a_store_it_cannot_open(tmp_path: Path) -> None:
    """The actor body outside Ray: a bad store fails ready() with the cause."""
    worker = RunnerWorker(e2e_agents.plain_agent, "nosuchscheme://x", None, "w", RunnerConfig(), 30)
    with pytest.raises(RuntimeError, match="failed"):
        worker.ready(30)
    assert worker.status()["running"] is False


def test_worker_options_from_the_cli_and_config_forms() -> None:
    assert parse_resources(["sandbox=1", "gpu_small=0.5"]) == {"sandbox": 1.0, "gpu_small": 0.5}
    with pytest.raises(UserError, match="NAME=AMOUNT"):
        parse_resources(["sandbox"])
    assert options_from_mapping({"num_cpus": 2, "resources": {"sandbox": 1}}).resources == {"sandbox": 1}
    with pytest.raises(UserError, match="valid"):
        options_from_mapping({"cpus": 2})
