"""Real smolagents agents, instrumented the way smolagents' users do it (OpenInference's
``SmolagentsInstrumentor``), and the fake-backend scripts they need."""

from __future__ import annotations

import re
from typing import Any

from openinference.instrumentation.smolagents import SmolagentsInstrumentor
from smolagents import OpenAIServerModel, ToolCallingAgent, tool

from agentbolt import types as t
from agentbolt.testing.fake_llm import FakeLLM, FakeRequest, Rule, ToolCall, ToolCalls

SmolagentsInstrumentor().instrument()  # what the user's code does; agentbolt is not mentioned


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression such as 12 * 7.

    Args:
        expression: digits, operators and parentheses.
    """
    if not re.fullmatch(r"[0-9+\-*/(). ]+", expression):
        raise ValueError(f"not an arithmetic expression: {expression!r}")
    return str(eval(expression, {"__builtins__": {}}))  # digits and operators only


def model_for(resources: t.Resources) -> OpenAIServerModel:
    assert resources.llm is not None
    return OpenAIServerModel(
        model_id=resources.llm.model, api_base=resources.llm.base_url, api_key=resources.llm.api_key or "x"
    )


def make_solver(model: OpenAIServerModel, name: str = "solver") -> ToolCallingAgent:
    return ToolCallingAgent(
        tools=[calculator],
        model=model,
        name=name,
        description="Solves arithmetic with the calculator.",
        max_steps=3,
        verbosity_level=0,
    )


def calc_agent(task: dict[str, Any], resources: t.Resources) -> float:
    """One ToolCallingAgent: a calculator call, then the final answer (two LLM calls)."""
    answer = make_solver(model_for(resources)).run(task["question"])
    return float(str(answer).strip() == str(task["answer"]))


def calc_team(task: dict[str, Any], resources: t.Resources) -> float:
    """A manager agent that delegates to the solver (a managed agent): four LLM calls."""
    model = model_for(resources)
    manager = ToolCallingAgent(
        tools=[], model=model, managed_agents=[make_solver(model)], name="manager", max_steps=3, verbosity_level=0
    )
    answer = manager.run(task["question"])
    return float(str(answer).strip() == str(task["answer"]))


def calc_tasks(n: int) -> list[dict[str, Any]]:
    return [
        {"question": f"What is {i} + {i + 2}?", "expression": f"{i} + {i + 2}", "answer": 2 * i + 2} for i in range(n)
    ]


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):  # content parts
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content or "")


def _question(request: FakeRequest) -> str:
    return next(_text(m) for m in request.messages if m["role"] == "user")


def _expression(request: FakeRequest) -> str:
    match = re.search(r"What is (\d+ \+ \d+)\?", _question(request))
    return match.group(1) if match else "0"


def calc_backend() -> FakeLLM:
    """The solver calls the calculator, then answers with what it returned; a manager first
    delegates to the solver, then answers with its report."""

    def observation(request: FakeRequest) -> str | None:
        text = _text(request.messages[-1])
        match = re.search(r"Observation:\s*(.+)", text, re.S)
        return match.group(1).strip() if match else None

    def manager_turn(request: FakeRequest) -> bool:
        return "solver" in str(request.body.get("tools", ""))

    def answer(request: FakeRequest) -> ToolCalls:
        seen = observation(request) or ""
        number = re.findall(r"-?\d+", seen)
        return ToolCalls([ToolCall("final_answer", {"answer": number[-1] if number else seen})])

    return FakeLLM(
        rules=[
            Rule(match=lambda r: observation(r) is not None, reply=answer),
            Rule(match=manager_turn, reply=lambda r: ToolCalls([ToolCall("solver", {"task": _question(r)})])),
            Rule(reply=lambda r: ToolCalls([ToolCall("calculator", {"expression": _expression(r)})])),
        ]
    )
