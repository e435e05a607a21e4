"""The plain ``openai`` client, traced with AgentOps as its quick start says (``agentops.init()``;
no API key here), its ``@agent`` and ``@tool`` decorators naming the agent and the tool.
agentbolt-agentops maps AgentOps' spans and keeps everything local without a key."""

from __future__ import annotations

import json
from typing import Any

import calc
from agentops.sdk.decorators import agent as agentops_agent
from agentops.sdk.decorators import tool
from openai import OpenAI

from agentbolt import types as t

STREAMING = False


def setup() -> None:
    import agentops

    agentops.init()


@tool(name="calculator")
def calculator(expression: str) -> str:
    return calc.calculator(expression)


def complete(client: OpenAI, model: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """One chat completion as a message dict (streamed and reassembled when ``STREAMING``)."""
    if not STREAMING:
        return (
            client.chat.completions.create(model=model, messages=messages, tools=[calc.OPENAI_TOOL])
            .choices[0]
            .message.model_dump(exclude_none=True)
        )  # type: ignore[arg-type]
    content, calls = "", {}
    stream = client.chat.completions.create(model=model, messages=messages, tools=[calc.OPENAI_TOOL], stream=True)  # type: ignore[arg-type]
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for call in delta.tool_calls or []:
            slot = calls.setdefault(
                call.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
            )
            slot["id"] = call.id or slot["id"]
            if call.function is not None:
                slot["function"]["name"] += call.function.name or ""
                slot["function"]["arguments"] += call.function.arguments or ""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message


@agentops_agent(name="solver")
def solve(client: OpenAI, model: str, question: str) -> str:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": calc.SYSTEM_PROMPT},
        {"role": "user", "content": question},
    ]
    for _ in range(3):
        reply = complete(client, model, messages)
        if not reply.get("tool_calls"):
            return str(reply.get("content") or "")
        messages.append(reply)
        for call in reply["tool_calls"]:
            result = calculator(**json.loads(call["function"]["arguments"]))
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    return ""


def agent(task: dict[str, Any], resources: t.Resources) -> float:
    assert resources.llm is not None
    client = OpenAI(base_url=resources.llm.base_url, api_key="x", max_retries=0)
    return calc.score(solve(client, resources.llm.model, task["question"]), task["answer"])
