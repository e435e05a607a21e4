"""A judge as the reward function of an agent trained offline (``Trainer.fit``).

    from agentbolt.rewards import LLMJudge, judged

    def answer(task, resources) -> str:            # the agent returns its answer, not a reward
        ...

    judge = LLMJudge("http://127.0.0.1:8000/v1", "judge-model")
    Trainer(judged(answer, judge), "torch-grpo").fit(train, val)

The wrapped agent's reward is the judge's rubric score of (task, answer), with the task's
``reference`` (when the task is a dict that has one) shown to the judge. A judge that fails
every try gives no reward: LightningRL leaves the rollout out and reports it (never a silent 0).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from .. import types as t
from .judge import LLMJudge
from .trajectory import Trajectory

__all__ = ["judged", "task_text"]

_TEXT_FIELDS = ("question", "prompt", "input", "task", "query")


def task_text(task: Any) -> str:
    """What was asked: a string task itself, else the first of ``question``, ``prompt``,
    ``input``, ``task``, ``query`` in a dict task, else its JSON."""
    if isinstance(task, str):
        return task
    if isinstance(task, Mapping):
        for name in _TEXT_FIELDS:
            if isinstance(task.get(name), str):
                return str(task[name])
    return orjson.dumps(task, default=str).decode()


def judged(
    answer: Callable[[Any, t.Resources], Any],
    judge: LLMJudge,
    *,
    reference_key: str = "reference",
) -> Callable[[Any, t.Resources], Any]:
    """An agent whose reward is ``judge``'s score of what ``answer(task, resources)`` returns
    (sync or async; its result is turned into text with ``str``)."""

    async def agent(task: Any, resources: t.Resources) -> float | None:
        if inspect.iscoroutinefunction(answer):
            result = await answer(task, resources)
        else:
            result = await asyncio.to_thread(answer, task, resources)
        reference = task.get(reference_key) if isinstance(task, Mapping) else None
        score = await judge.score(
            Trajectory.of_text(task_text(task), str(result)),
            reference=str(reference) if reference is not None else None,
        )
        return None if score is None else score.reward

    agent.__name__ = f"judged_{getattr(answer, '__name__', 'agent')}"
    agent.__qualname__ = agent.__name__
    return agent
