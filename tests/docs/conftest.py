"""The store the docs' shell blocks read as ``sqlite:///runs.db``: one finished run of training and
held-out rollouts, made by the real Trainer, gateway and runner against the fake LLM."""

from __future__ import annotations

import asyncio
import itertools
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI

from agentbolt import types as t
from agentbolt.algorithm import Algorithm, AlgorithmContext
from agentbolt.testing.fake_llm import FakeLLM, FakeLLMServer, FakeRequest, Rule
from agentbolt.trainer import Trainer


async def answer_agent(task: dict[str, Any], resources: t.Resources) -> float:
    assert resources.llm is not None
    headers = {"X-Agentbolt-Agent-Name": "write_query"}  # the role the docs' agent_match examples select
    async with AsyncOpenAI(
        base_url=resources.llm.base_url, api_key="x", max_retries=0, default_headers=headers
    ) as client:
        reply = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": task["question"]}]
        )
    words = (reply.choices[0].message.content or "").split()
    return 1.0 if words and words[0] == str(task["answer"]) else 0.0


class TwoSteps(Algorithm):
    """Held-out rollouts, two steps of training rollouts in groups of two, held-out again."""

    name = "docs-two-steps"

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream

    async def run(self, ctx: AlgorithmContext, train: list[t.Task], val: list[t.Task]) -> None:
        await asyncio.to_thread(ctx.gateway.set_upstreams, [self.upstream])
        await ctx.publish(t.Resources(llm=t.LLMEndpoint(base_url=ctx.gateway_url, model="fake-model")))
        await ctx.run_rollouts(val, mode=t.RolloutMode.VAL, tag="val0", step=0)
        for step in (1, 2):
            rollouts = await ctx.run_rollouts(train, group_size=2, tag=f"step{step}", step=step)
            rewards = [r.final_reward or 0.0 for r in rollouts]
            ctx.log_metrics(step, {"train/reward": sum(rewards) / len(rewards)})
        await ctx.run_rollouts(val, mode=t.RolloutMode.VAL, tag="val2", step=2)


@pytest.fixture(scope="session")
def docs_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("docs-store") / "runs.db"
    tasks = [{"task_id": f"q{i}", "question": f"What is {i} + {i}?", "answer": 2 * i} for i in range(4)]
    drafts = itertools.count()  # samples differ, as a sampling policy's do

    def reply(request: FakeRequest) -> str:
        return f"{'2' if '1 + 1' in request.text else 'no idea'} (draft {next(drafts)})"

    llm = FakeLLM(rules=[Rule(reply=reply)])
    with FakeLLMServer(llm) as server:
        trainer = Trainer(
            answer_agent, TwoSteps(server.base_url), store=f"sqlite:///{path}", n_runners=0, progress=False, adapters=[]
        )
        trainer.fit(tasks[:2], tasks[2:])
    snapshot = path.with_name("snapshot.db")  # one self-contained file to copy (nothing left in a -wal beside it)
    with sqlite3.connect(path) as source, sqlite3.connect(snapshot) as target:
        source.backup(target)
    return snapshot
