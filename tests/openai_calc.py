"""A calculator agent written with the plain OpenAI client, and the fake backend it needs: the code
the AgentOps and OpenLLMetry test agents decorate the way their users do (``ao_agents.py``,
``ol_agents.py``) and the undecorated agent AgentOps traces as the runner's tracer."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

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


def evaluate(expression: str) -> str:
    if not re.fullmatch(r"[0-9+\-*/(). ]+", expression):
        raise ValueError(f"not an arithmetic expression: {expression!r}")
    return str(eval(expression, {"__builtins__": {}}))  # digits and operators only


def solve(client: OpenAI, model: str, question: str, calculator: Callable[..., str] = evaluate) -> str:
    """Ask, run the calculator calls the model makes, ask again; the final text."""
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


def calc_agent(task: dict[str, Any], resources: t.Resources) -> float:
    """The undecorated solver: a calculator call, then the answer (two LLM calls)."""
    client, model = client_for(resources)
    return score(solve(client, model, task["question"]), task["answer"])


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
