"""The trainer records its run in the store: start, per-step metrics, rollouts linked, the end."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import e2e_agents
import pytest

from agentbolt import types as t
from agentbolt.algorithm import Algorithm, AlgorithmContext
from agentbolt.options import RunnerOptions
from agentbolt.store import RolloutSearch, RunStatus, open_store
from agentbolt.testing.fake_llm import FakeLLM, FakeLLMServer
from agentbolt.trainer import Trainer


class TwoSteps(Algorithm):
    name = "two-steps"

    def __init__(self, upstream: str, fail: bool = False, api_key: str = "sk-secret") -> None:
        self.upstream = upstream
        self.fail = fail
        self.api_key = api_key
        self.model = "fake-model"

    async def run(self, ctx: AlgorithmContext, train: list[t.Task], val: list[t.Task]) -> int:
        await asyncio.to_thread(ctx.gateway.set_upstreams, [self.upstream])
        await ctx.publish(t.Resources(llm=t.LLMEndpoint(base_url=ctx.gateway_url, model="fake-model")))
        for step in (1, 2):
            rollouts = await ctx.run_rollouts(train, group_size=2, tag=f"step{step}", step=step)
            ctx.log_metrics(step, {"train/reward": sum(r.final_reward or 0 for r in rollouts) / len(rollouts)})
            ctx.log_metrics(step, {"update/loss": 1.0 / step, "bad": float("nan")})  # non-finite values are left out
        if self.fail:
            raise ValueError("diverged")
        return 2


def _read(url: str) -> tuple[Any, Any, Any]:
    async def go() -> tuple[Any, Any, Any]:
        store = open_store(url)
        try:
            (run,) = await store.list_runs()
            metrics = await store.get_run_metrics(run.run_id)
            page = await store.search_rollouts(RolloutSearch(run_id=run.run_id, step=2))
            return run, metrics, page
        finally:
            await store.close()

    return asyncio.run(go())


def test_fit_records_the_run(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    with FakeLLMServer(FakeLLM()) as server:
        trainer = Trainer(
            e2e_agents.plain_agent, TwoSteps(server.base_url), store=url, runners=RunnerOptions(n=0), progress=False
        )
        assert trainer.fit([{"task_id": f"t{i}", "i": i} for i in range(3)]) == 2
    run, metrics, page = _read(url)
    assert (run.algorithm, run.model, run.status, run.steps) == ("two-steps", "fake-model", RunStatus.SUCCEEDED, 2)
    assert "api_key" not in run.config and run.config["fail"] is False  # credentials are not recorded
    assert [(m.step, sorted(m.values)) for m in metrics] == [
        (1, ["train/reward"]),
        (1, ["update/loss"]),
        (2, ["train/reward"]),
        (2, ["update/loss"]),
    ]
    assert run.latest["update/loss"] == 0.5
    assert page.total == 6 and {r.run_id for r in page.items} == {run.run_id}


def test_a_failing_algorithm_fails_its_run(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    with FakeLLMServer(FakeLLM()) as server:
        trainer = Trainer(
            e2e_agents.plain_agent,
            TwoSteps(server.base_url, fail=True),
            store=url,
            runners=RunnerOptions(n=0),
            progress=False,
        )
        with pytest.raises(ValueError, match="diverged"):
            trainer.fit([{"task_id": "t0", "i": 0}])
    run, metrics, _ = _read(url)
    assert run.status is RunStatus.FAILED and run.error == "ValueError: diverged" and run.ended_at is not None
    assert len(metrics) == 4  # written before the run was finished


def test_dev_records_an_evaluate_run(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    with FakeLLMServer(FakeLLM()) as server:
        Trainer(e2e_agents.plain_agent, store=url, runners=RunnerOptions(n=0), progress=False).dev(
            [{"i": i} for i in range(2)], llm=server.base_url, model="fake-model"
        )
    run, metrics, _ = _read(url)
    assert (run.algorithm, run.model, run.status) == ("evaluate", "fake-model", RunStatus.SUCCEEDED)
    assert [m.step for m in metrics] == [0] and "eval/reward_mean" in metrics[0].values
    values = metrics[0].values  # reconciliation, in the run's metrics: the gateway's calls are LightningRL's
    assert values["eval/gateway_calls"] == values["eval/lightningrl_calls"] > 0
    assert values["eval/rollouts_unreconciled"] == 0 and values["eval/unjoined_llm_spans"] == 0
