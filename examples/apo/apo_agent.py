"""An arithmetic agent whose system prompt is a resource: the one change APO needs.

The agent reads ``resources.prompts["system"]`` instead of a string in its code; APO publishes a
new version of that prompt for every candidate it tries. The reward is strict about the format:
1.0 only when the reply is the bare number, so the prompt decides much of the score.
"""

from __future__ import annotations

import re
from typing import Any

import openai

from agentbolt.types import Resources

NUMBER = re.compile(r"-?\d+")


def reward(reply: str, answer: int) -> float:
    """1.0 for exactly the number (a trailing period allowed), else 0.0."""
    return float(reply.strip().rstrip(".").strip() == str(answer))


async def math_agent(task: dict[str, Any], resources: Resources) -> float:
    """Ask the policy the question with the published system prompt; score the reply."""
    assert resources.llm is not None
    client = openai.AsyncOpenAI(base_url=resources.llm.base_url, api_key=resources.llm.api_key or "none", max_retries=0)
    reply = await client.chat.completions.create(
        model=resources.llm.model,
        messages=[
            {"role": "system", "content": resources.prompts["system"]},  # <- the prompt APO optimizes
            {"role": "user", "content": task["question"]},
        ],
        max_tokens=32,
    )
    return reward(reply.choices[0].message.content or "", task["answer"])
