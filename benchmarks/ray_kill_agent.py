"""The agent of ``ray_kill.py`` (its own module, so Ray workers import it without running the benchmark)."""

from __future__ import annotations

from typing import Any

import openai

from agentbolt import types as t


async def two_call_agent(task: dict[str, Any], resources: t.Resources) -> float:
    """Two LLM calls (the second streamed) through the gateway; the reward is the task's ``i / 1000``."""
    assert resources.llm is not None
    client = openai.AsyncOpenAI(base_url=resources.llm.base_url, api_key="k", max_retries=0)
    messages: list[Any] = [{"role": "user", "content": f"question {task['i']}"}]
    first = await client.chat.completions.create(model=resources.llm.model, messages=messages)
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "more"},
    ]
    stream = await client.chat.completions.create(model=resources.llm.model, messages=messages, stream=True)
    async for _ in stream:
        pass
    return task["i"] / 1000
