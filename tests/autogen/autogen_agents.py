"""Real AutoGen AgentChat agents (Calc-X style) and the fake-backend scripts they need."""

from __future__ import annotations

import re
from typing import Any

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.conditions import TextMentionTermination
from autogen_agentchat.teams import RoundRobinGroupChat
from autogen_ext.models.openai import OpenAIChatCompletionClient

from agentbolt import types as t
from agentbolt.testing.fake_llm import FakeLLM, FakeRequest, Rule, ToolCall, ToolCalls

MODEL_INFO: Any = {
    "vision": False,
    "function_calling": True,
    "json_output": False,
    "family": "unknown",
    "structured_output": False,
}
SOLVER_PROMPT = "You solve arithmetic with the calculator tool."
CHECKER_PROMPT = "You are the checker: reply APPROVE when the answer is right."


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression such as 12 * 7."""
    if not re.fullmatch(r"[0-9+\-*/(). ]+", expression):
        raise ValueError(f"not an arithmetic expression: {expression!r}")
    value = eval(expression, {"__builtins__": {}})  # digits and operators only
    return str(int(value) if float(value).is_integer() else value)


def client_for(resources: t.Resources | None = None, *, base_url: str | None = None) -> OpenAIChatCompletionClient:
    if resources is not None:
        assert resources.llm is not None
        base_url, model, key = resources.llm.base_url, resources.llm.model, resources.llm.api_key
    else:
        model, key = "fake-model", None
    return OpenAIChatCompletionClient(
        model=model, base_url=base_url, api_key=key or "x", model_info=MODEL_INFO, max_retries=0
    )


def make_solver(client: OpenAIChatCompletionClient, name: str = "solver") -> AssistantAgent:
    return AssistantAgent(
        name, model_client=client, tools=[calculator], reflect_on_tool_use=True, system_message=SOLVER_PROMPT
    )


def score(answer: str, expected: Any) -> float:
    numbers = re.findall(r"-?\d+(?:\.\d+)?", answer)
    return float(bool(numbers) and float(numbers[-1]) == float(expected))


async def calc_agent(task: dict[str, Any], resources: t.Resources) -> float:
    """One AssistantAgent with a calculator tool: tool call, then the answer (two LLM calls)."""
    client = client_for(resources)
    try:
        result = await make_solver(client).run(task=task["question"])
    finally:
        await client.close()
    return score(str(result.messages[-1].to_text()), task["answer"])


async def calc_team(
    task: dict[str, Any], resources: t.Resources | None, *, client: OpenAIChatCompletionClient | None = None
) -> float:
    """A RoundRobinGroupChat: the solver (tool + answer), then the checker approves."""
    client = client or client_for(resources)
    checker = AssistantAgent("checker", model_client=client, system_message=CHECKER_PROMPT)
    team = RoundRobinGroupChat(
        [make_solver(client), checker], termination_condition=TextMentionTermination("APPROVE", sources=["checker"])
    )
    try:
        result = await team.run(task=task["question"])
    finally:
        await client.close()
    answers = [m.to_text() for m in result.messages if getattr(m, "source", None) == "solver"]
    return score(answers[-1], task["answer"])


def calc_tasks(n: int) -> list[dict[str, Any]]:
    return [{"question": f"What is {i + 2} * {i + 3}?", "answer": (i + 2) * (i + 3)} for i in range(n)]


def _reply(req: FakeRequest) -> str | ToolCalls:
    system = str(req.messages[0].get("content", "")) if req.messages else ""
    if "checker" in system:
        return "APPROVE"
    last = req.messages[-1] if req.messages else {}
    if last.get("role") == "tool":
        return f"The answer is {last.get('content')}."
    match = re.search(r"What is (.+)\?", req.text)
    return ToolCalls([ToolCall("calculator", {"expression": match.group(1) if match else req.text})])


def calc_backend() -> FakeLLM:
    """The fake model: calls the calculator on the question, then reports its result."""
    return FakeLLM(rules=[Rule(reply=_reply)])
