"""CrewAI: a crew of one ``Agent`` (role ``solver``) with a calculator ``@tool`` and one
``Task``, on ``crewai.LLM`` aimed at the OpenAI-compatible endpoint (streaming: ``LLM(stream=True)``
and ``Crew(stream=True)``, whose ``kickoff()`` yields the chunks, then ``.result``), traced for Phoenix with
OpenInference's ``CrewAIInstrumentor``. CrewAI's own usage telemetry is turned off with its
documented switch (``CREWAI_DISABLE_TELEMETRY=true``), as for any user without network."""

from __future__ import annotations

import os
import re
from typing import Any

import calc

from agentbolt import types as t
from agentbolt.testing.fake_llm import FakeLLM, FakeRequest, Rule, ToolCall, ToolCalls

STREAMING = False


def setup() -> None:
    os.environ["CREWAI_DISABLE_TELEMETRY"] = "true"
    os.environ["CREWAI_TRACING_ENABLED"] = "false"
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    from openinference.instrumentation.crewai import CrewAIInstrumentor

    CrewAIInstrumentor().instrument()


def agent(task: dict[str, Any], resources: t.Resources) -> float:
    from crewai import LLM, Agent, Crew, Task
    from crewai.tools import tool

    assert resources.llm is not None

    @tool("calculator")
    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression such as 12 * 7."""
        return calc.calculator(expression)

    llm = LLM(model=f"openai/{resources.llm.model}", base_url=resources.llm.base_url, api_key="x", stream=STREAMING)
    solver = Agent(
        role="solver",
        goal="Solve arithmetic with the calculator.",
        backstory=calc.SYSTEM_PROMPT,
        tools=[calculator],
        llm=llm,
    )
    job = Task(description=task["question"], expected_output="The answer.", agent=solver)
    crew = Crew(agents=[solver], tasks=[job], stream=STREAMING)
    if not STREAMING:
        return calc.score(str(crew.kickoff()), task["answer"])
    streaming = crew.kickoff()  # a CrewStreamingOutput: the chunks as the LLM streams them, then the result
    chunks = [chunk.content for chunk in streaming]
    if not chunks:
        raise RuntimeError("Crew(stream=True) streamed no chunk")
    return calc.score(str(streaming.result), task["answer"])


def backend() -> FakeLLM:
    """Native tool calls when the request offers tools, CrewAI's ReAct text otherwise."""

    def prompt(request: FakeRequest) -> str:
        return " ".join(calc.text(m.get("content")) for m in request.messages or [])

    def observation(request: FakeRequest) -> str | None:
        last = request.messages[-1] if request.messages else {}
        if last.get("role") == "tool":
            return calc.text(last.get("content")).strip()
        match = re.search(r"Observation:\s*(-?\d+)", prompt(request))
        return match.group(1) if match else None

    def reply(request: FakeRequest) -> str | ToolCalls:
        seen = observation(request)
        if seen is not None:
            return f"Thought: I now know the final answer\nFinal Answer: The answer is {seen}."
        if request.tools:
            return ToolCalls([ToolCall("calculator", {"expression": calc.expression(request)})])
        return (
            "Thought: I use the calculator.\nAction: calculator\n"
            f'Action Input: {{"expression": "{calc.expression(request)}"}}'
        )

    return FakeLLM(rules=[Rule(reply=reply)])
