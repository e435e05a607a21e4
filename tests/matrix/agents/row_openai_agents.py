"""OpenAI Agents SDK: an ``Agent`` named ``solver`` with a calculator ``function_tool`` on a
Chat Completions model, run with ``Runner.run`` (or ``Runner.run_streamed``, streaming).
agentbolt-openai-agents instruments it with no code for agentbolt."""

from __future__ import annotations

from typing import Any

import calc
from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool
from openai import AsyncOpenAI

from agentbolt import types as t

STREAMING = False


@function_tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression such as 12 * 7."""
    return calc.calculator(expression)


def setup() -> None:
    """Nothing: the adapter adds its tracing processor itself."""


async def agent(task: dict[str, Any], resources: t.Resources) -> float:
    assert resources.llm is not None
    async with AsyncOpenAI(base_url=resources.llm.base_url, api_key="x", max_retries=0) as client:
        model = OpenAIChatCompletionsModel(model=resources.llm.model, openai_client=client)
        solver = Agent(name="solver", instructions=calc.SYSTEM_PROMPT, model=model, tools=[calculator])
        if STREAMING:
            run = Runner.run_streamed(solver, task["question"])
            async for _ in run.stream_events():
                pass
            output = run.final_output
        else:
            output = (await Runner.run(solver, task["question"])).final_output
    return calc.score(str(output), task["answer"])
