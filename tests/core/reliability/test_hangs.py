"""Nothing waits forever: hanging, loop-blocking and process-killing agents (one test per hang)."""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path

import pytest

from agentbolt import types as t
from agentbolt.runners.runner import Runner, RunnerConfig
from agentbolt.store import open_store
from agentbolt.trainer import Trainer

from . import hang_agents

UNUSED_LLM = "http://127.0.0.1:9/v1"  # the agents never call it
# Runner processes (not the in-process runner of dev()): these agents hang or kill their process.


def _trainer(tmp_path: Path, agent: object, **runners: object) -> Trainer:
    return Trainer(
        agent,
        store=f"sqlite:///{tmp_path}/runs.db",
        runners={"n": 1, "lease_s": 1.5, **runners},
        capture={"adapters": []},
        progress=False,
    )


def test_a_sync_agent_that_never_returns_times_out_and_the_trainer_finishes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="agentbolt.runners.pool"):
        result = _trainer(tmp_path, hang_agents.never_returns, timeout_s=1.0).dev([0], llm=UNUSED_LLM, in_process=False)
    # The runner process exited on its own (the pool did not have to kill it), whatever the clock says.
    assert not [r for r in caplog.records if "killing it" in r.getMessage()]
    assert result.failed == 1 and list(result.failures) == ["timeout: timeout"], result.failures


async def test_an_agent_blocking_its_loop_does_not_stall_heartbeats() -> None:
    store = open_store("memory://")
    await store.enqueue([t.RolloutSpec(rollout_id="r", input=3.0)])  # blocks 3 s; the lease is 1 s
    runner = Runner(hang_agents.blocks_its_loop, store, config=RunnerConfig(lease_s=1.0, adapters=[]))
    stop = asyncio.Event()
    task = asyncio.ensure_future(runner.run(stop))
    (rollout,) = await store.wait_for_rollouts(["r"], timeout=20)
    stop.set()
    await asyncio.wait_for(task, 10)
    await store.close()
    assert rollout.status is t.RolloutStatus.SUCCEEDED and rollout.attempt_count == 1  # never lost


async def test_an_agent_ignoring_cancellation_is_abandoned_and_its_loop_replaced() -> None:
    store = open_store("memory://")
    await store.enqueue([t.RolloutSpec(rollout_id="stuck", input=4.0, timeout_s=0.5)])
    config = RunnerConfig(concurrency=1, cancel_grace_s=0.3, adapters=[])
    runner = Runner(hang_agents.blocks_its_loop, store, config=config)
    stop = asyncio.Event()
    task = asyncio.ensure_future(runner.run(stop))
    (stuck,) = await store.wait_for_rollouts(["stuck"], timeout=20)
    await store.enqueue([t.RolloutSpec(rollout_id="next", input=0.0)])
    (following,) = await store.wait_for_rollouts(["next"], timeout=20)
    stop.set()
    stats = await asyncio.wait_for(task, 10)
    await store.close()
    assert stuck.status is t.RolloutStatus.FAILED and stuck.error is not None
    assert stuck.error.kind is t.ErrorKind.TIMEOUT
    # the next rollout ran on a fresh agent loop while the stuck agent still blocked the old one
    assert following.status is t.RolloutStatus.SUCCEEDED
    assert following.ended_at is not None and stuck.started_at is not None
    assert following.ended_at - stuck.started_at < 3.5
    assert stats.abandoned == 1


async def test_sync_agent_threads_do_not_keep_the_runner_from_finishing() -> None:
    store = open_store("memory://")
    await store.enqueue([t.RolloutSpec(rollout_id="r", timeout_s=0.3)])
    config = RunnerConfig(adapters=[], exit_when_idle_s=0.3, cancel_grace_s=0.1)
    stats = await asyncio.wait_for(Runner(hang_agents.never_returns, store, config=config).run(), 20)
    await store.close()
    assert stats.abandoned == 1
    stuck = [th for th in threading.enumerate() if th.name.startswith("agentbolt-agent")]
    assert stuck and all(th.daemon for th in stuck)  # they cannot hold the process at exit


def test_a_dead_runner_process_is_replaced(tmp_path: Path) -> None:
    marker = tmp_path / "killed"
    result = _trainer(tmp_path, hang_agents.kills_its_process_once).dev([str(marker)], llm=UNUSED_LLM, in_process=False)
    assert marker.exists()  # the first runner process did die
    assert result.failures == {} and result.reward_mean == 1.0


def test_the_trainer_fails_clearly_when_no_runner_is_left(tmp_path: Path) -> None:
    # a hang instead of this error would be cut off by the suite's per-test timeout
    with pytest.raises(RuntimeError, match="no runner process is left"):
        _trainer(tmp_path, hang_agents.kills_its_process, restarts=1).dev([0], llm=UNUSED_LLM, in_process=False)
