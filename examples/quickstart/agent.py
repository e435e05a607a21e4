"""The quickstart agent: a plain-Python math agent on the OpenAI client.

Nothing in it knows about training: it gets an OpenAI base URL and a model name in
``resources`` and returns a reward. Offered the calculator tool (``with_tool``: ``train.py
--tool``, ``benchmarks/async.py``) it may call it, the model decides; the quickstart's default
agent is :func:`math_agent_no_tool`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import openai
from math_tasks import CALCULATOR_TOOL, few_shot, reward, tool_replies

from agentbolt.types import Resources

MAX_TURNS = 3


async def math_agent(
    task: dict[str, Any],
    resources: Resources,
    *,
    with_tool: bool = True,
    client: openai.AsyncOpenAI | None = None,
    tool_delay: Callable[[], Awaitable[None]] | None = None,
) -> float:
    """Answer ``task["question"]``; the reward says whether ``<answer>`` holds the right number.

    ``client``: an OpenAI client of your own (e.g. with headers) instead of one for ``resources.llm``;
    ``tool_delay``: awaited before each calculator answer (benchmarks/async.py's slow tools).
    """
    assert resources.llm is not None, "publish an llm endpoint in the resources"
    if client is None:
        client = openai.AsyncOpenAI(
            base_url=resources.llm.base_url, api_key=resources.llm.api_key or "none", max_retries=0
        )
    messages = [*few_shot(with_tool), {"role": "user", "content": task["question"]}]
    extra: dict[str, Any] = {"tools": [CALCULATOR_TOOL]} if with_tool else {}
    text: str | None = None
    for _ in range(MAX_TURNS):
        reply = await client.chat.completions.create(model=resources.llm.model, messages=messages, **extra)
        message = reply.choices[0].message
        text = message.content
        if not message.tool_calls:
            break
        if tool_delay is not None:
            await tool_delay()
        messages.append(message.model_dump(exclude_none=True))
        messages.extend(tool_replies(message.tool_calls))
    return reward(text, int(task["answer"]))


async def math_agent_no_tool(task: dict[str, Any], resources: Resources) -> float:
    """The same agent without the calculator (one LLM call per question)."""
    return await math_agent(task, resources, with_tool=False)
