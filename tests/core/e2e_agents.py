"""Agents used by runner and trainer tests (a module, so runner processes can import them)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import openai

from agentbolt import types as t
from agentbolt.capture.emit import emit_message, emit_reward


async def plain_agent(task: dict[str, Any], resources: t.Resources) -> float:
    """Two LLM calls (one streamed) with the plain OpenAI client; reward derived from the task."""
    assert resources.llm is not None
    client = openai.AsyncOpenAI(base_url=resources.llm.base_url, api_key=resources.llm.api_key or "k", max_retries=0)
    messages = [{"role": "user", "content": f"question {task['i']}"}]
    first = await client.chat.completions.create(model=resources.llm.model, messages=messages)
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "again"},
    ]
    stream = await client.chat.completions.create(model=resources.llm.model, messages=messages, stream=True)
    async for _ in stream:
        pass
    emit_message(f"done {task['i']}")
    return task["i"] / 100


def sync_plain_agent(task: dict[str, Any], resources: t.Resources) -> None:
    """A synchronous agent that emits its reward instead of returning it."""
    assert resources.llm is not None
    client = openai.OpenAI(base_url=resources.llm.base_url, api_key="k", max_retries=0)
    client.chat.completions.create(model=resources.llm.model, messages=[{"role": "user", "content": f"q {task['i']}"}])
    emit_reward({"correct": task["i"] % 2, "format": 1.0}, primary="correct")
    return None


async def mixed_agent(task: dict[str, Any], resources: t.Resources) -> float:
    """Behaves as the task says: ok, raise, hang, or call an upstream that fails."""
    assert resources.llm is not None
    client = openai.AsyncOpenAI(base_url=resources.llm.base_url, api_key="k", max_retries=0)
    kind = task["kind"]
    if kind == "raise":
        raise ValueError(f"the tool broke on task {task['i']}")
    if kind == "hang":
        await asyncio.sleep(600)
    content = "please fail" if kind == "upstream500" else f"hello {task['i']}"
    await client.chat.completions.create(model=resources.llm.model, messages=[{"role": "user", "content": content}])
    return 1.0


def slow_sync_agent(task: dict[str, Any], resources: t.Resources) -> float:
    time.sleep(task.get("sleep", 0.2))
    return 1.0


async def parity_agent(task: dict[str, Any], resources: t.Resources) -> float:
    """One call; reward is the parity of the reply's length (varies within a group on a random model)."""
    assert resources.llm is not None
    client = openai.AsyncOpenAI(base_url=resources.llm.base_url, api_key="none", max_retries=0)
    reply = await client.chat.completions.create(
        model=resources.llm.model, messages=[{"role": "user", "content": task["question"]}]
    )
    return float(len(reply.choices[0].message.content or "") % 2)
