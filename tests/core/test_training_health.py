"""Training-health findings on stores written by real runs: a scripted algorithm drives the real
Trainer, runner, gateway and SQLite store against the fake LLM, whose answers change with the
step as a policy's would (right on a share of tasks, tool calls or not, samples distinct or not).
Each finding fires on the run made to show it and stays silent on the runs that do not; the
dashboard's windowed loader agrees with ``agentbolt doctor``."""

from __future__ import annotations

import asyncio
import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from openai import AsyncOpenAI
from typer.testing import CliRunner

from agentbolt import types as t
from agentbolt.algorithm import Algorithm, AlgorithmContext
from agentbolt.cli import app
from agentbolt.options import CaptureOptions, RunnerOptions
from agentbolt.runs.doctor import DoctorReport, doctor
from agentbolt.runs.health import run_health, step_metrics
from agentbolt.store import open_store
from agentbolt.testing.fake_llm import FakeLLM, FakeLLMServer, FakeRequest, Rule, ToolCall, ToolCalls
from agentbolt.trainer import Trainer

TOOLS = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]
STEPS = 4


def task(split: str, k: int, *, tools: bool) -> dict[str, Any]:
    return {"task_id": f"{split}-{k}", "question": f"[{split}-{k}] What is {k} + 10?", "answer": k + 10, "tools": tools}


@dataclass
class Policy:
    """What the fake LLM answers at the current step. ``right(split, k, step)`` says whether task
    ``k`` of ``split`` is answered right; ``calls_tool(step)`` whether it first calls the tool."""

    right: Callable[[str, int, int], bool]
    calls_tool: Callable[[int], bool] = lambda step: False
    distinct: bool = True
    """Each sample differs (a draft number) or samples of one prompt are identical."""
    step: int = 0
    drafts: Any = field(default_factory=itertools.count)

    def reply(self, request: FakeRequest) -> Any:
        messages = request.messages or []
        m = re.search(r"\[(\w+)-(\d+)\]", str(messages[0].get("content")))
        assert m is not None
        split, k = m.group(1), int(m.group(2))
        if request.tools and messages[-1].get("role") == "user" and self.calls_tool(self.step):
            return ToolCalls([ToolCall("calc", {"expression": f"{k} + 10"})])
        answer = k + 10 if self.right(split, k, self.step) else k + 11
        return f"<answer>{answer}</answer>" + (f" (draft {next(self.drafts)})" if self.distinct else "")


async def agent(task: dict[str, Any], resources: t.Resources) -> float:
    """Asks the question, runs the tool when the model calls it, rewards the right answer."""
    assert resources.llm is not None
    messages: list[Any] = [{"role": "user", "content": task["question"]}]
    extra = {"tools": TOOLS} if task["tools"] else {}
    async with AsyncOpenAI(base_url=resources.llm.base_url, api_key="x", max_retries=0) as client:
        for _ in range(3):
            reply = await client.chat.completions.create(model="m", messages=messages, **extra)
            message = reply.choices[0].message
            if not message.tool_calls:
                break
            messages.append(message.model_dump(exclude_none=True))
            for call in message.tool_calls:
                messages.append({"role": "tool", "tool_call_id": call.id, "content": str(task["answer"])})
    m = re.search(r"<answer>(\d+)</answer>", message.content or "")
    return 1.0 if m and int(m.group(1)) == task["answer"] else 0.0


class ScriptedRun(Algorithm):
    """Held-out evaluation at step 0, ``STEPS`` training steps of groups of 4, held-out again at
    the end; the policy moves to each step before its rollouts (as weights would after an update)."""

    name = "scripted-policy"

    def __init__(self, upstream: str, policy: Policy) -> None:
        self.upstream = upstream
        self.policy = policy

    async def run(self, ctx: AlgorithmContext, train: list[t.Task], val: list[t.Task]) -> None:
        await asyncio.to_thread(ctx.gateway.set_upstreams, [self.upstream])
        await ctx.publish(t.Resources(llm=t.LLMEndpoint(base_url=ctx.gateway_url, model="fake-model")))
        if val:
            await ctx.run_rollouts(val, mode=t.RolloutMode.VAL, tag="val0", step=0)
        for step in range(1, STEPS + 1):
            self.policy.step = step
            rollouts = await ctx.run_rollouts(train, group_size=4, tag=f"step{step}", step=step)
            ctx.log_metrics(step, step_metrics(rollouts, await ctx.spans(rollouts)))
        if val:
            await ctx.run_rollouts(val, mode=t.RolloutMode.VAL, tag=f"val{STEPS}", step=STEPS)


def share(p: Callable[[int], float], n: int) -> Callable[[int, int], bool]:
    """Task ``k`` of ``n`` is right at ``step`` when ``k < round(p(step) * n)``."""
    return lambda k, step: k < round(p(step) * n)


def train_run(
    tmp_path: Path, policy: Policy, *, n_train: int = 6, n_val: int = 8, tools: bool = False
) -> tuple[str, str]:
    """Run the scripted policy into a fresh SQLite store; returns (store URL, run id)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{tmp_path}/runs.db"
    train = [task("train", k, tools=tools) for k in range(n_train)]
    val = [task("val", k, tools=tools) for k in range(n_val)]
    with FakeLLMServer(FakeLLM(rules=[Rule(reply=policy.reply)])) as server:
        trainer = Trainer(
            agent,
            ScriptedRun(server.base_url, policy),
            store=url,
            runners=RunnerOptions(n=0, concurrency=24),
            progress=False,
            capture=CaptureOptions(adapters=[]),
        )
        trainer.fit(train, val)

    async def run_id() -> str:
        store = open_store(url)
        try:
            (run,) = await store.list_runs()
            return run.run_id
        finally:
            await store.close()

    return url, asyncio.run(run_id())


def reports(url: str, run_id: str) -> tuple[DoctorReport, Any]:
    """``agentbolt doctor``'s report of the store and the dashboard's windowed health of the run."""

    async def go() -> tuple[DoctorReport, Any]:
        store = open_store(url)
        try:
            return await doctor(store), await run_health(store, run_id)
        finally:
            await store.close()

    report, health = asyncio.run(go())
    (run,) = report.runs
    assert health.findings == run.findings  # the dashboard reads only the windows, and agrees
    assert health.first == run.first and health.last == run.last and health.held_out == run.held_out
    return report, run


def codes(run: Any) -> set[str]:
    return {f.code for f in run.findings}


def test_reward_rising_while_held_out_stays_flat_is_flagged(tmp_path: Path) -> None:
    train_share = share(lambda step: step / STEPS, 6)  # 0.25 of training tasks right at step 1, all at step 4
    policy = Policy(right=lambda split, k, step: train_share(k, step) if split == "train" else k < 2)
    url, run_id = train_run(tmp_path, policy)
    report, run = reports(url, run_id)
    assert codes(run) == {"reward_without_heldout_gain"}
    assert run.held_out.before == run.held_out.after == 0.25 and run.held_out.paired and run.held_out.tasks == 8
    assert run.first.reward < run.last.reward == 1.0
    (finding,) = run.findings
    assert finding.run_id == run_id and "held-out reward went 0.250 -> 0.250" in finding.message
    assert not report.ok and report.capture_ok  # capture is fine; training is not
    out = CliRunner().invoke(app, ["doctor", "--store", url])
    assert out.exit_code == 1, out.output
    assert "capture ok" in out.output and "WARNING reward_without_heldout_gain" in out.output
    assert f"training health of {run_id}: 1 warning" in out.output


def test_a_policy_that_learns_the_task_raises_no_alarm(tmp_path: Path) -> None:
    """Training and held-out rewards rise together, samples differ, tools are called: no finding."""
    train_share, val_share = share(lambda step: step / STEPS, 6), share(lambda step: step / STEPS, 8)
    policy = Policy(
        right=lambda split, k, step: (train_share if split == "train" else val_share)(k, step),
        calls_tool=lambda step: True,
    )
    url, run_id = train_run(tmp_path, policy, tools=True)
    report, run = reports(url, run_id)
    assert run.findings == [] and report.ok
    assert run.held_out.delta == 1.0 and run.last.tool_call_rate == 1.0
    assert run.last.duplicate_share == 0.0 and run.last.near_certain_share < 0.1  # the fake's logprobs: -k/1024


def test_identical_samples_and_tools_never_called(tmp_path: Path) -> None:
    policy = Policy(right=lambda split, k, step: k % 2 == 0, distinct=False)  # flat reward, no tool call
    url, run_id = train_run(tmp_path, policy, tools=True)
    _, run = reports(url, run_id)
    assert codes(run) == {"identical_samples", "tools_never_called"}
    assert run.last.duplicate_share == 0.75 and run.last.identical_groups == run.last.multi_groups == 6
    assert run.first.tool_call_rate == run.last.tool_call_rate == 0.0


def test_tool_calls_that_stop_are_flagged(tmp_path: Path) -> None:
    policy = Policy(right=lambda split, k, step: k % 2 == 0, calls_tool=lambda step: step <= STEPS // 2)
    url, run_id = train_run(tmp_path, policy, tools=True)
    _, run = reports(url, run_id)
    assert codes(run) == {"tool_calls_dropped"}
    assert (run.first.tool_call_rate, run.last.tool_call_rate) == (1.0, 0.0)


def test_a_held_out_set_too_small_to_tell_and_none_at_all(tmp_path: Path) -> None:
    train_share = share(lambda step: step / STEPS, 6)
    # three held-out tasks whose results swap: +1/3 on average, far from significant
    before, after = {0: True, 1: False, 2: False}, {0: False, 1: True, 2: True}
    policy = Policy(
        right=lambda split, k, step: (
            train_share(k, step) if split == "train" else (after if step == STEPS else before)[k]
        )
    )
    url, run_id = train_run(tmp_path / "small", policy, n_val=3)
    _, run = reports(url, run_id)
    assert codes(run) == {"heldout_inconclusive"} and run.findings[0].severity == "info"

    url, run_id = train_run(tmp_path / "none", Policy(right=lambda split, k, step: train_share(k, step)), n_val=0)
    _, run = reports(url, run_id)
    assert codes(run) == {"no_heldout"} and run.held_out is None


def test_step_metrics_are_recorded_with_the_run(tmp_path: Path) -> None:
    policy = Policy(right=lambda split, k, step: True, calls_tool=lambda step: step % 2 == 1, distinct=False)
    url, run_id = train_run(tmp_path, policy, tools=True)

    async def metrics() -> list[Any]:
        store = open_store(url)
        try:
            return await store.get_run_metrics(run_id)
        finally:
            await store.close()

    rows = {m.step: m.values for m in asyncio.run(metrics())}
    assert [rows[s]["health/tool_call_rate"] for s in range(1, STEPS + 1)] == [1.0, 0.0, 1.0, 0.0]
    assert all(rows[s]["health/duplicate_share"] == 0.75 for s in rows)
    assert all(0 < rows[s]["health/surprisal"] < 1 for s in rows)  # the fake's logprobs are in [-1, 0)
