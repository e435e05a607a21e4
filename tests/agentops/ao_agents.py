"""Agents instrumented the way AgentOps' users do it: ``agentops.init()`` (no API key: a user
trying AgentOps locally) and AgentOps' decorators around plain OpenAI client code."""

from __future__ import annotations

import json
import re
from typing import Any

from agentops.sdk.decorators import agent, tool, workflow
from openai import OpenAI

from agentbolt import types as t
from agentbolt.testing.fake_llm import FakeLLM, FakeRequest, Rule, ToolCall, ToolCalls

SOLVER_PROMPT = "You solve arithmetic with the calculator tool."
CHECKER_PROMPT = "You are the checker: reply APPROVE when the answer is right."
CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression such as 12 * 7.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}


def init_agentops() -> Any:
    """``agentops.init()`` without an API key, and an in-memory exporter on AgentOps' provider
    (what the user's own processors would see); returns the exporter."""
    import agentops
    from agentops.sdk.core import tracer
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    agentops.init()
    exporter = InMemorySpanExporter()
    assert tracer.provider is not None
    tracer.provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


@tool(name="calculator")
def calculator(expression: str) -> str:
    if not re.fullmatch(r"[0-9+\-*/(). ]+", expression):
        raise ValueError(f"not an arithmetic expression: {expression!r}")
    return str(eval(expression, {"__builtins__": {}}))  # digits and operators only


@agent(name="solver")
def solve(client: OpenAI, model: str, question: str) -> str:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SOLVER_PROMPT},
        {"role": "user", "content": question},
    ]
    for _ in range(3):
        reply = client.chat.completions.create(model=model, messages=messages, tools=[CALCULATOR]).choices[0].message
        if not reply.tool_calls:
            return reply.content or ""
        messages.append(reply.model_dump(exclude_none=True))
        for call in reply.tool_calls:
            try:
                result = calculator(**json.loads(call.function.arguments))
            except Exception as exc:
                result = f"error: {exc}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return ""


@agent(name="checker")
def check(client: OpenAI, model: str, question: str, answer: str) -> bool:
    messages = [{"role": "system", "content": CHECKER_PROMPT}, {"role": "user", "content": f"{question} {answer}"}]
    return "APPROVE" in (
        client.chat.completions.create(model=model, messages=messages).choices[0].message.content or ""
    )


def client_for(resources: t.Resources) -> tuple[OpenAI, str]:
    assert resources.llm is not None
    return OpenAI(
        base_url=resources.llm.base_url, api_key=resources.llm.api_key or "x", max_retries=0
    ), resources.llm.model


@workflow(name="calc")
def calc_agent(task: dict[str, Any], resources: t.Resources) -> float:
    """The solver: a calculator call, then the answer (two LLM calls)."""
    client, model = client_for(resources)
    return score(solve(client, model, task["question"]), task["answer"])


@workflow(name="calc_team")
def calc_team(task: dict[str, Any], resources: t.Resources) -> float:
    """The solver, then the checker (three LLM calls)."""
    client, model = client_for(resources)
    answer = solve(client, model, task["question"])
    return score(answer, task["answer"]) if check(client, model, task["question"], answer) else 0.0


def score(answer: str, expected: Any) -> float:
    numbers = re.findall(r"-?\d+", answer)
    return float(bool(numbers) and int(numbers[-1]) == int(expected))


def calc_tasks(n: int) -> list[dict[str, Any]]:
    return [{"question": f"What is {i} + {i + 2}?", "answer": 2 * i + 2} for i in range(n)]


def calc_backend() -> FakeLLM:
    def expression(request: FakeRequest) -> str:
        match = re.search(r"What is (\d+ \+ \d+)\?", str(request.messages[1]["content"]))
        return match.group(1) if match else "0"

    return FakeLLM(
        rules=[
            Rule(match=lambda r: "checker" in str(r.messages[0]["content"]), reply="APPROVE"),
            Rule(
                match=lambda r: r.messages[-1]["role"] == "tool",
                reply=lambda r: f"The answer is {r.messages[-1]['content']}.",
            ),
            Rule(reply=lambda r: ToolCalls([ToolCall("calculator", {"expression": expression(r)})])),
        ]
    )
