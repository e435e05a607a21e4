"""What every row of the framework matrix shares: the calculator tool, the two tasks with the
rewards the agent computes for them (the hand-count), and the fake backend that answers any
framework's chat requests (a calculator call, then the answer from the tool's result)."""

from __future__ import annotations

import json
import re
from typing import Any

from agentbolt.testing.fake_llm import FakeLLM, FakeRequest, Rule, ToolCall, ToolCalls

SYSTEM_PROMPT = "You solve arithmetic with the calculator tool."
TOOL_DESCRIPTION = "Evaluate an arithmetic expression such as 12 * 7."
TASKS: list[dict[str, Any]] = [
    {"question": "What is 1 + 3?", "answer": 4},
    {"question": "What is 2 + 4?", "answer": 7},  # a wrong reference answer: the agent scores 0
]
REWARDS = {"What is 1 + 3?": 1.0, "What is 2 + 4?": 0.0}
"""The reward each task's rollout must carry: the agent's own ``score``, worked by hand."""
OPENAI_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": TOOL_DESCRIPTION,
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}
"""The calculator in the OpenAI tools format, for the rows that write their own tool loop."""


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression such as 12 * 7."""
    if not re.fullmatch(r"[0-9+\-*/(). ]+", expression):
        raise ValueError(f"not an arithmetic expression: {expression!r}")
    return str(eval(expression, {"__builtins__": {}}))  # digits and operators only


def score(answer: str, expected: Any) -> float:
    """The agent's reward: 1.0 when the last number of its answer is the expected one."""
    numbers = re.findall(r"-?\d+", answer)
    return float(bool(numbers) and int(numbers[-1]) == int(expected))


def text(content: Any) -> str:
    """A message's content as text (a string, or a list of content parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            text(part.get("text", part.get("content", ""))) if isinstance(part, dict) else str(part) for part in content
        )
    return "" if content is None else json.dumps(content, default=str)


def expression(request: FakeRequest) -> str:
    for message in request.messages or []:
        match = re.search(r"What is (\d+ \+ \d+)\?", text(message.get("content")))
        if match:
            return match.group(1)
    return "0"


def tool_result(request: FakeRequest) -> str | None:
    """The calculator's result when the last message is a tool result, else None."""
    last = (request.messages or [{}])[-1]
    return text(last.get("content")).strip() if last.get("role") == "tool" else None


def backend(*, final_tool: str | None = None) -> FakeLLM:
    """Call the calculator, then answer with its result (as a ``final_tool`` call when the
    framework ends a run with one, like smolagents' ``final_answer``)."""

    def answer(request: FakeRequest) -> str | ToolCalls:
        result = tool_result(request) or ""
        if final_tool is not None:
            return ToolCalls([ToolCall(final_tool, {"answer": f"The answer is {result}."})])
        return f"The answer is {result}."

    return FakeLLM(
        rules=[
            Rule(match=lambda r: tool_result(r) is not None, reply=answer),
            Rule(reply=lambda r: ToolCalls([ToolCall("calculator", {"expression": expression(r)})])),
        ]
    )
