"""smolagents: a ``ToolCallingAgent`` named ``solver`` with a calculator ``@tool`` on
``OpenAIServerModel`` (``stream_outputs=True`` streams each call), instrumented the way its
users do for Phoenix (OpenInference's ``SmolagentsInstrumentor``). The run ends with
smolagents' ``final_answer`` tool."""

from __future__ import annotations

import re
from typing import Any

import calc
from smolagents import OpenAIServerModel, ToolCallingAgent, tool

from agentbolt import types as t
from agentbolt.testing.fake_llm import FakeLLM, FakeRequest, Rule, ToolCall, ToolCalls

STREAMING = False


def setup() -> None:
    from openinference.instrumentation.smolagents import SmolagentsInstrumentor

    SmolagentsInstrumentor().instrument()


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression such as 12 * 7.

    Args:
        expression: digits, operators and parentheses.
    """
    return calc.calculator(expression)


def agent(task: dict[str, Any], resources: t.Resources) -> float:
    assert resources.llm is not None
    model = OpenAIServerModel(model_id=resources.llm.model, api_base=resources.llm.base_url, api_key="x")
    solver = ToolCallingAgent(
        tools=[calculator], model=model, name="solver", max_steps=3, verbosity_level=0, stream_outputs=STREAMING
    )
    return calc.score(str(solver.run(task["question"])), task["answer"])


def backend() -> FakeLLM:
    """smolagents gives a tool's result back as an ``Observation:`` message."""

    def observation(request: FakeRequest) -> str | None:
        match = re.search(r"Observation:\s*(.+)", calc.text((request.messages or [{}])[-1].get("content")), re.S)
        return match.group(1).strip() if match else None

    def answer(request: FakeRequest) -> ToolCalls:
        numbers = re.findall(r"-?\d+", observation(request) or "")
        return ToolCalls([ToolCall("final_answer", {"answer": f"The answer is {numbers[-1] if numbers else ''}."})])

    return FakeLLM(
        rules=[
            Rule(match=lambda r: observation(r) is not None, reply=answer),
            Rule(reply=lambda r: ToolCalls([ToolCall("calculator", {"expression": calc.expression(r)})])),
        ]
    )
