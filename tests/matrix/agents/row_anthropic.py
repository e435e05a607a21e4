"""The plain ``anthropic`` client: a tool-use loop (the calculator, then the answer from its
result) on the Messages API, through the gateway's ``/v1/messages``; ``messages.stream`` when
streaming. No instrumentation: the gateway records each call, and ``agent_names`` names it
``solver`` from its system prompt."""

from __future__ import annotations

import re
from typing import Any

import anthropic
import calc

from agentbolt import types as t

STREAMING = False
CAPTURE = {"agent_names": {"solver": re.compile(r"^You solve")}}
CALCULATOR = {
    "name": "calculator",
    "description": calc.TOOL_DESCRIPTION,
    "input_schema": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
}


def setup() -> None:
    """Nothing to set up: no instrumentation."""


def agent(task: dict[str, Any], resources: t.Resources) -> float:
    assert resources.llm is not None
    client = anthropic.Anthropic(base_url=resources.llm.base_url.removesuffix("/v1"), api_key="x", max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": task["question"]}]
    request: dict[str, Any] = {
        "model": resources.llm.model,
        "max_tokens": 256,
        "system": calc.SYSTEM_PROMPT,
        "tools": [CALCULATOR],
    }
    for _ in range(3):
        if STREAMING:
            with client.messages.stream(messages=messages, **request) as stream:  # type: ignore[arg-type]
                reply = stream.get_final_message()
        else:
            reply = client.messages.create(messages=messages, **request)  # type: ignore[arg-type]
        uses = [block for block in reply.content if block.type == "tool_use"]
        if not uses:
            answer = "".join(block.text for block in reply.content if block.type == "text")
            return calc.score(answer, task["answer"])
        messages.append({"role": "assistant", "content": [block.model_dump() for block in reply.content]})
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": use.id, "content": calc.calculator(**use.input)}  # type: ignore[arg-type]
                    for use in uses
                ],
            }
        )
    return 0.0
