"""pydantic-ai: an ``Agent`` named ``solver`` with a calculator tool on ``OpenAIChatModel``,
traced with pydantic-ai's own OpenTelemetry instrumentation (``Agent.instrument_all()``: GenAI
semantic-convention spans on the global tracer provider); ``run_stream`` when streaming."""

from __future__ import annotations

from typing import Any

import calc
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from agentbolt import types as t

STREAMING = False


def setup() -> None:
    Agent.instrument_all()


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression such as 12 * 7."""
    return calc.calculator(expression)


async def agent(task: dict[str, Any], resources: t.Resources) -> float:
    assert resources.llm is not None
    model = OpenAIChatModel(resources.llm.model, provider=OpenAIProvider(base_url=resources.llm.base_url, api_key="x"))
    solver = Agent(model, name="solver", system_prompt=calc.SYSTEM_PROMPT, tools=[calculator])
    if STREAMING:
        async with solver.run_stream(task["question"]) as run:
            output = await run.get_output()
    else:
        output = (await solver.run(task["question"])).output
    return calc.score(str(output), task["answer"])
