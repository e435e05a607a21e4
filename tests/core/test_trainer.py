"""The trainer end to end: dev(), fit() with a custom algorithm, failure handling."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import e2e_agents
import pytest

from agentbolt import hookimpl
from agentbolt import types as t
from agentbolt.algorithm import Algorithm, AlgorithmContext, EvaluateResult, batches
from agentbolt.errors import UserError
from agentbolt.options import RunnerOptions
from agentbolt.plugins import default_plugins
from agentbolt.testing.fake_llm import Failure, FakeLLM, FakeLLMServer
from agentbolt.trainer import Trainer


def test_dev_reports_capture(tmp_path: Path) -> None:
    with FakeLLMServer(FakeLLM()) as server:
        trainer = Trainer(
            e2e_agents.plain_agent, store=f"sqlite:///{tmp_path}/dev.db", runners=RunnerOptions(n=1), progress=False
        )
        result = trainer.dev(
            [{"i": i} for i in range(10)], llm=server.base_url, model="fake-model", n_samples=2, in_process=False
        )
    assert isinstance(result, EvaluateResult)
    assert (result.rollouts, result.succeeded, result.failed) == (20, 20, 0)
    assert result.reward_mean == pytest.approx(sum(i / 100 for i in range(10)) / 10)
    assert result.llm_calls == 40 and result.capture_ok()
    assert result.prompt_tokens > 0 and result.response_tokens > 0


class IgnoreTokenIdRequests:
    """ASGI middleware: the upstream ignores return_token_ids, as hosted APIs do."""

    def __init__(self, app: Any) -> None:
        self.app = app

    def __getattr__(self, name: str) -> Any:  # the server manages the wrapped app (close, ...)
        return getattr(self.app, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "app":
            object.__setattr__(self, name, value)
        else:
            setattr(self.app, name, value)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        app = self.app
        if scope["type"] != "http" or scope["method"] != "POST":
            return await app(scope, receive, send)
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        data = json.loads(body)
        data.pop("return_token_ids", None)
        stripped = json.dumps(data).encode()
        sent = False

        async def replay() -> dict[str, Any]:
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": stripped, "more_body": False}

        await app(scope, replay, send)


def test_dev_flags_missing_token_ids() -> None:
    server = FakeLLMServer(FakeLLM())
    server.app = IgnoreTokenIdRequests(server.app)
    with server:
        result = Trainer(e2e_agents.plain_agent, store="memory://", runners=RunnerOptions(n=0), progress=False).dev(
            [{"i": 1}], llm=server.base_url
        )
    assert result.llm_calls == 2 and result.calls_missing_ids == 2 and not result.capture_ok()


def test_failures_get_their_documented_status_and_the_run_continues(tmp_path: Path) -> None:
    backend = FakeLLM(failures=[Failure(kind="status", status=500, match="please fail")])
    items = [
        {"kind": "ok", "i": 0},
        {"kind": "raise", "i": 1},
        {"kind": "hang", "i": 2},
        {"kind": "upstream500", "i": 3},
        {"kind": "ok", "i": 4},
    ]
    with FakeLLMServer(backend) as server:
        trainer = Trainer(
            e2e_agents.mixed_agent,
            store=f"sqlite:///{tmp_path}/mixed.db",
            runners=RunnerOptions(n=1, timeout_s=6.0, max_attempts=2),
            # generous: a loaded CI machine must not time out the healthy rollouts
            progress=True,
        )
        result = trainer.dev(items, llm=server.base_url)
    assert result.succeeded == 2 and result.failed == 3
    assert result.failures == {
        "agent: ValueError": 1,  # an exception in the agent: failed, not retried
        "timeout: timeout": 1,  # past timeout_s: timed out, not retried
        "infrastructure: InternalServerError": 1,  # upstream 500 -> gateway 502: retried, then failed
    }
    upstream_calls = [r for r in backend.requests if "please fail" in str(r.body)]
    assert len(upstream_calls) == 2  # one per attempt


class CountingAlgorithm(Algorithm):
    """A tiny custom algorithm: two steps of rollouts, recording what it saw."""

    name = "counting"

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.seen: list[Any] = []

    async def run(self, ctx: AlgorithmContext, train: list[t.Task], val: list[t.Task]) -> dict[str, Any]:
        await asyncio.to_thread(ctx.gateway.set_upstreams, [self.upstream])
        for step, batch in enumerate(batches(train, 3, epochs=1, seed=1)):
            res = await ctx.publish(t.Resources(llm=t.LLMEndpoint(base_url=ctx.gateway_url, model="fake-model")))
            rollouts = await ctx.run_rollouts(batch, group_size=2, tag=f"step{step}")
            spans = await ctx.spans(rollouts)
            groups = {r.group_id for r in rollouts}
            assert len(groups) == len(batch) and all(r.resources_version == res.version for r in rollouts)
            ctx.log_metrics(step, {"reward": sum(r.final_reward or 0 for r in rollouts) / len(rollouts)})
            self.seen.append((step, len(rollouts), sum(len(v) for v in spans.values())))
        return {"steps": len(self.seen)}


def test_fit_with_a_custom_algorithm(tmp_path: Path) -> None:
    with FakeLLMServer(FakeLLM()) as server:
        algo = CountingAlgorithm(server.base_url)
        trainer = Trainer(
            e2e_agents.plain_agent,
            algo,
            store="memory://",
            runners=RunnerOptions(n=0),
            metrics_path=tmp_path / "metrics.jsonl",
            progress=False,
        )
        out = trainer.fit([{"task_id": f"t{i}", "i": i} for i in range(6)])
    assert out == {"steps": 2}
    assert [s[:2] for s in algo.seen] == [(0, 6), (1, 6)]
    assert all(n_spans >= 6 * 4 for _, _, n_spans in algo.seen)  # 2 LLM calls + message + reward per rollout
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2 and '"reward"' in lines[0]


class _AlgoPlugin:
    @hookimpl
    def agentbolt_register_algorithms(self, register: Any) -> None:
        register("counting-test", CountingAlgorithm)


def test_algorithm_by_name_through_the_plugin_registry() -> None:
    plugins = default_plugins()
    name = plugins.register(_AlgoPlugin(), name="test-algos")
    try:
        with FakeLLMServer(FakeLLM()) as server:
            out = Trainer(
                e2e_agents.plain_agent,
                "counting-test",
                algorithm_config={"upstream": server.base_url},
                store="memory://",
                runners=RunnerOptions(n=0),
                progress=False,
            ).fit([{"i": i} for i in range(3)])
        assert out == {"steps": 1}
        with pytest.raises(UserError, match="valid names"):
            Trainer(
                e2e_agents.plain_agent,
                "no-such-algo",
                store="memory://",
                runners=RunnerOptions(n=0),
            ).fit([{"i": 1}])
    finally:
        plugins.unregister(name)


def test_trainer_rejects_unusable_settings() -> None:
    with pytest.raises(UserError, match="memory://"):
        Trainer(
            e2e_agents.plain_agent,
            store="memory://",
            runners=RunnerOptions(n=2),
        )
    with pytest.raises(UserError, match="needs an endpoint"):
        Trainer(
            e2e_agents.plain_agent,
            store="memory://",
            runners=RunnerOptions(n=0),
        ).dev([{"i": 1}])
    with pytest.raises(UserError, match="appears more than once"):
        Trainer(
            e2e_agents.plain_agent,
            store="memory://",
            runners=RunnerOptions(n=0),
        ).dev([{"task_id": "a"}, {"task_id": "a"}], llm="http://127.0.0.1:9/v1")


class EvaluatingAlgorithm(CountingAlgorithm):
    """CountingAlgorithm that also evaluates the held-out tasks before and after, and records
    ``train/reward`` and ``time/step_s``."""

    name = "evaluating"

    async def run(self, ctx: AlgorithmContext, train: list[t.Task], val: list[t.Task]) -> dict[str, Any]:
        await asyncio.to_thread(ctx.gateway.set_upstreams, [self.upstream])
        await ctx.publish(t.Resources(llm=t.LLMEndpoint(base_url=ctx.gateway_url, model="fake-model")))
        for step in (0, 1):
            if step:
                rollouts = await ctx.run_rollouts(train, group_size=2, tag="step1", step=1)
                reward = sum(r.final_reward or 0 for r in rollouts) / len(rollouts)
                ctx.log_metrics(1, {"train/reward": reward, "time/step_s": 2.0})
            await ctx.run_rollouts(val, group_size=1, mode=t.RolloutMode.VAL, tag=f"val{step}", step=step)
        return {"steps": 1}


def test_a_run_ends_with_its_summary_card(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The console summary at the end of fit(): held-out before -> after named as the run names its
    metric, the trivial policies, the training reward as a mean of the last steps, s/step."""
    with FakeLLMServer(FakeLLM()) as server:
        trainer = Trainer(
            e2e_agents.plain_agent,
            EvaluatingAlgorithm(server.base_url),
            store="memory://",
            runners=RunnerOptions(n=0),
            progress=True,
            run={
                "config": {"heldout_metric": {"name": "exact_match", "threshold": 0.05}, "trivial": {"constant": 0.1}}
            },
        )
        trainer.fit([{"task_id": f"t{i}", "i": i} for i in range(2)], [{"task_id": f"v{i}", "i": i} for i in range(8)])
    err = " ".join(capsys.readouterr().err.split())
    assert "did it learn?" in err
    # plain_agent's reward is i / 100: 3 of 8 held-out tasks (i = 5, 6, 7) reach 0.05, before and after
    assert "held-out exact_match 0.375 ± 0.171 -> 0.375 ± 0.171 (n=8, steps 0 -> 1" in err
    assert "trivial policies (exact_match): best constant 0.100" in err
    assert "training reward 0.005 (mean of the last 1 steps)" in err and "2.0 s/step (mean of 1 steps)" in err


def test_without_progress_the_summary_card_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    """``progress=False`` (log lines only, e.g. ``--no-progress``) still ends with the card, as log
    records of agentbolt.trainer: the same lines the console summary prints."""
    with FakeLLMServer(FakeLLM()) as server:
        trainer = Trainer(
            e2e_agents.plain_agent,
            EvaluatingAlgorithm(server.base_url),
            store="memory://",
            runners=RunnerOptions(n=0),
            progress=False,
            run={"config": {"heldout_metric": {"name": "exact_match", "threshold": 0.05}}},
        )
        with caplog.at_level(logging.INFO, logger="agentbolt.trainer"):
            trainer.fit(
                [{"task_id": f"t{i}", "i": i} for i in range(2)], [{"task_id": f"v{i}", "i": i} for i in range(8)]
            )
    logged = [r.getMessage() for r in caplog.records if r.name == "agentbolt.trainer"]
    assert any(m.endswith(": did it learn?") for m in logged), logged
    assert "  held-out exact_match 0.375 ± 0.171 -> 0.375 ± 0.171 (n=8, steps 0 -> 1, +0.0 se)" in logged
    assert any(m.startswith("  findings: ") for m in logged)  # the training-health checks ran


class LabelledResult:
    """A result naming its entries for the console summary, as TorchGRPOResult does."""

    summary_labels = {"accuracy_after": None, "reward_last": "training reward, last step"}

    def to_dict(self) -> dict[str, Any]:
        return {"steps": 1, "accuracy_after": 0.123, "reward_last": 0.456}


class LabelledAlgorithm(EvaluatingAlgorithm):
    name = "labelled"

    async def run(self, ctx: AlgorithmContext, train: list[t.Task], val: list[t.Task]) -> Any:
        await super().run(ctx, train, val)
        return LabelledResult()


def test_the_console_summary_names_each_figure_once(capsys: pytest.CaptureFixture[str]) -> None:
    """A result's ``summary_labels`` name its entries (a last step's value says so); an entry the
    summary card states (held-out figures, with their standard errors) is not shown a second time
    under the algorithm's own key."""
    with FakeLLMServer(FakeLLM()) as server:
        Trainer(
            e2e_agents.plain_agent,
            LabelledAlgorithm(server.base_url),
            store="memory://",
            runners=RunnerOptions(n=0),
            progress=True,
            run={"config": {"heldout_metric": {"name": "exact_match", "threshold": 0.05}}},
        ).fit([{"task_id": f"t{i}", "i": i} for i in range(2)], [{"task_id": f"v{i}", "i": i} for i in range(8)])
    err = " ".join(capsys.readouterr().err.split())
    assert "training reward, last step" in err and "0.456" in err and "reward_last" not in err
    assert "accuracy_after" not in err and "0.123" not in err
    assert "held-out exact_match 0.375 ± 0.171 -> 0.375" in err  # the card states the held-out figure
