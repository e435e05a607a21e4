"""An agent for the runner actors the binding starts in Ray (a module Ray workers import)."""

from __future__ import annotations

from typing import Any

from agentbolt import types as t


async def task_reward_agent(task: dict[str, Any], resources: t.Resources) -> float:
    """No LLM call: the reward is the task's ``reward``."""
    return float(task["reward"])
