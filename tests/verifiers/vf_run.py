"""Helpers: run a verifiers environment through Trainer.dev (memory store, in-process runner)
against the fake LLM, and run the same environment directly in verifiers against the same fake."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import verifiers.v1 as vf

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.lightningrl import LightningRL
from agentbolt.options import CaptureOptions, RunnerOptions
from agentbolt.store.memory import MemoryStore
from agentbolt.trainer import Trainer


@dataclass
class DevRun:
    rollouts: list[t.Rollout]
    spans: dict[str, list[t.Span]]
    transitions: list[t.Transition]
    result: Any

    def llm_spans(self, rollout_id: str) -> list[t.Span]:
        return [s for s in self.spans[rollout_id] if s.attributes.get(semconv.SPAN_KIND_ATTR) == semconv.KIND_LLM]

    def reward_spans(self, rollout_id: str) -> list[t.Span]:
        return [s for s in self.spans[rollout_id] if s.name == semconv.SPAN_REWARD]


def dev_run(agent: Any, tasks: list[t.Task], base_url: str, *, concurrency: int = 3) -> DevRun:
    store = MemoryStore()  # type: ignore[abstract]
    trainer = Trainer(
        agent,
        store=store,
        runners=RunnerOptions(n=0, concurrency=concurrency),
        capture=CaptureOptions(adapters=[]),
        progress=False,
    )
    result = trainer.dev(tasks, llm=base_url, model="fake-model")

    async def collect() -> DevRun:
        rollouts = (await store.query_rollouts(limit=10_000)).items
        spans = await store.query_spans([r.rollout_id for r in rollouts], latest_attempt_only=True)
        batch = LightningRL(credit="final", advantage="grpo", allow_empty=True).process(rollouts, spans)
        return DevRun(rollouts, spans, batch.transitions, result)

    return asyncio.run(collect())


async def direct_episodes(env: vf.Env, base_url: str) -> dict[str, Any]:
    """Every task of ``env`` run by verifiers itself (no agentbolt), its client on ``base_url``:
    task id -> episode."""
    ctx = vf.ModelContext(model="fake-model", client=vf.EvalClientConfig(base_url=base_url, api_key_var="NO_KEY"))
    out: dict[str, Any] = {}
    async with env.serving():
        for task in env.taskset:
            out[str(task.data.id or task.key)] = await env.run_episode(task, ctx)
    return out
