"""Scoring prompt versions with real rollouts: every (version, task) pair is one rollout pinned to
that resources version, all enqueued at once so runners evaluate candidates concurrently."""

from __future__ import annotations

import asyncio
import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.algorithm import AlgorithmContext

from .optimizer import Failure

__all__ = ["Evaluation", "evaluate_versions", "failures_of"]


@dataclass
class Evaluation:
    """How one prompt version did on a batch of tasks."""

    version: int
    rollouts: list[t.Rollout]

    @property
    def rewards(self) -> list[float]:
        """One reward per rollout: a failed rollout, or one without a reward, counts as 0."""
        return [
            r.final_reward if r.status is t.RolloutStatus.SUCCEEDED and r.final_reward is not None else 0.0
            for r in self.rollouts
        ]

    @property
    def score(self) -> float:
        """The mean reward (0.0 for an empty batch)."""
        return statistics.fmean(self.rewards) if self.rollouts else 0.0

    @property
    def failed(self) -> int:
        """Rollouts that did not succeed."""
        return sum(r.status is not t.RolloutStatus.SUCCEEDED for r in self.rollouts)

    @property
    def no_reward(self) -> int:
        """Succeeded rollouts that reported no reward."""
        return sum(r.status is t.RolloutStatus.SUCCEEDED and r.final_reward is None for r in self.rollouts)


async def evaluate_versions(
    ctx: AlgorithmContext,
    versions: Sequence[int],
    tasks: Sequence[t.Task],
    *,
    mode: t.RolloutMode,
    tag: str,
    step: int,
    description: str,
) -> dict[int, Evaluation]:
    """Run every task once with every resources version in ``versions``; wait for all of them.

    Rollout ids are ``{run}:{tag}:v{version}:{task_id}`` (enqueueing is idempotent on them)."""
    specs = []
    for version in versions:
        for task in tasks:
            rid = f"{ctx.run_id}:{tag}:v{version}:{task.task_id}"
            specs.append(
                t.RolloutSpec(
                    rollout_id=rid,
                    task_id=task.task_id,
                    input=task.input,
                    mode=mode,
                    group_id=rid,
                    resources_version=version,
                    max_attempts=ctx.max_attempts,
                    timeout_s=ctx.timeout_s,
                    metadata={**task.metadata, "apo_prompt_version": version},
                    run_id=ctx.run_id,
                    step=step,
                )
            )
    if not specs:
        return {v: Evaluation(v, []) for v in versions}
    rollouts = await ctx.store.enqueue(specs)
    ids = [r.rollout_id for r in rollouts]
    phase = ctx.progress.phase(description, len(ids))
    done = 0
    while True:
        states = await ctx.store.wait_for_rollouts(ids, timeout=1.0)
        finished = sum(r.status.is_final for r in states)
        if finished > done:
            phase.advance(finished - done)
            done = finished
        if finished == len(ids):
            break
    phase.done()
    await asyncio.to_thread(ctx.gateway.flush)
    by_version: dict[int, list[t.Rollout]] = {v: [] for v in versions}
    for rollout in states:
        assert rollout.resources_version is not None
        by_version[rollout.resources_version].append(rollout)
    return {v: Evaluation(v, rs) for v, rs in by_version.items()}


def _message_text(message: Mapping[str, object]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    if "parts" in message and isinstance(message["parts"], list):  # OpenTelemetry GenAI format
        content = "".join(str(p.get("content", "")) for p in message["parts"] if isinstance(p, Mapping))
    text = str(content or "")
    if message.get("tool_calls"):
        text += ("\n" if text else "") + "tool calls: " + json.dumps(message["tool_calls"], default=str)
    return text


def _last_reply(spans: Sequence[t.Span]) -> str | None:
    for span in reversed(spans):
        raw = span.attributes.get(semconv.GEN_AI_OUTPUT_MESSAGES)
        if not isinstance(raw, str):
            continue
        try:
            messages = json.loads(raw)
        except ValueError:
            continue
        if isinstance(messages, list) and messages and isinstance(messages[0], Mapping):
            return _message_text(messages[0])
    return None


async def failures_of(ctx: AlgorithmContext, evaluation: Evaluation, threshold: float, limit: int) -> list[Failure]:
    """The rollouts of ``evaluation`` whose reward is below ``threshold`` (failed ones first,
    then the lowest rewards; at most ``limit``), with the agent's last LLM reply as output."""
    scored = list(zip(evaluation.rollouts, evaluation.rewards, strict=True))
    bad = [(r, w) for r, w in scored if r.status is not t.RolloutStatus.SUCCEEDED or w < threshold]
    bad.sort(key=lambda rw: (rw[0].status is t.RolloutStatus.SUCCEEDED, rw[1]))
    bad = bad[:limit]
    spans = await ctx.spans([r for r, _ in bad]) if bad else {}
    failures = []
    for rollout, _ in bad:
        if rollout.status is not t.RolloutStatus.SUCCEEDED:
            error = rollout.error
            output = f"the rollout {rollout.status.value}" + (f": {error.type}: {error.message}" if error else "")
            reward = None
        else:
            reply = _last_reply(spans.get(rollout.rollout_id, []))
            output = reply if reply is not None else "(no LLM reply was recorded for this task)"
            reward = rollout.final_reward
        failures.append(Failure(task_id=rollout.task_id or "?", input=rollout.input, output=output, reward=reward))
    return failures
