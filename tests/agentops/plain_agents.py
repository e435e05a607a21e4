"""A plain OpenAI-client agent that never mentions any instrumentation (for the AgentOps tracer)."""

from __future__ import annotations

import json
import re
from typing import Any

from openai import OpenAI

from agentbolt import types as t
from agentbolt.testing.fake_llm import FakeLLM, Rule, ToolCall, ToolCalls

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression such as 12 * 7.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}


def calc_agent(task: dict[str, Any], resources: t.Resources) -> float:
    assert resources.llm is not None
    client = OpenAI(base_url=resources.llm.base_url, api_key="x", max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": task["question"]}]
    reply = client.chat.completions.create(model=resources.llm.model, messages=messages, tools=[CALCULATOR])
    call = reply.choices[0].message.tool_calls[0]
    expression = json.loads(call.function.arguments)["expression"]
    messages += [
        reply.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": str(eval(expression, {"__builtins__": {}}))},
    ]
    answer = client.chat.completions.create(model=resources.llm.model, messages=messages).choices[0].message.content
    numbers = re.findall(r"-?\d+", answer or "")
    return float(bool(numbers) and int(numbers[-1]) == task["answer"])


def calc_tasks(n: int) -> list[dict[str, Any]]:
    return [{"question": f"What is {i} + {i + 2}?", "answer": 2 * i + 2} for i in range(n)]


def calc_backend() -> FakeLLM:
    def expression(request: Any) -> str:
        match = re.search(r"What is (\d+ \+ \d+)\?", str(request.messages[0]["content"]))
        return match.group(1) if match else "0"

    return FakeLLM(
        rules=[
            Rule(
                match=lambda r: r.messages[-1]["role"] == "tool",
                reply=lambda r: f"The answer is {r.messages[-1]['content']}.",
            ),
            Rule(reply=lambda r: ToolCalls([ToolCall("calculator", {"expression": expression(r)})])),
        ]
    )
