"""The calculator agent: an AutoGen AgentChat ``AssistantAgent`` with a ``calculator`` tool.

Plain AutoGen code: the agent reads only ``resources.llm`` (base URL, model name, key) and returns
the reward. The model decides whether to call the calculator; with ``reflect_on_tool_use`` a tool
call is followed by a second model call that writes the answer from the tool's result. A few
worked examples open the model context (one of them through the calculator): a 135M model calls
a tool only when it has seen one called.
"""

from __future__ import annotations

from typing import Any

from autogen_agentchat.agents import AssistantAgent
from autogen_core import FunctionCall
from autogen_core.model_context import UnboundedChatCompletionContext
from autogen_core.models import (
    AssistantMessage,
    FunctionExecutionResult,
    FunctionExecutionResultMessage,
    LLMMessage,
    ModelInfo,
    UserMessage,
)
from autogen_core.tools import FunctionTool
from autogen_ext.models.openai import OpenAIChatCompletionClient
from calculator import evaluate, format_number
from data import parse_number

SYSTEM = "Solve the math word problem. Give the final answer as a number inside <answer>...</answer>."

MODEL_INFO = ModelInfo(
    vision=False, function_calling=True, json_output=False, family="unknown", structured_output=False
)


def calculator(expression: str) -> str:
    """Evaluate arithmetic with + - * / ** and parentheses, e.g. 4 * 6."""
    return format_number(evaluate(expression))


CALCULATOR = FunctionTool(calculator, name="calculator", description="Evaluate arithmetic, e.g. 4 * 6")


def few_shot() -> list[LLMMessage]:
    """Three worked examples: two through the calculator, then one answered directly.

    A direct example comes last: a 135M model imitates the turn just before the question, and
    ending on a tool example makes it write the tool's results itself.
    """

    def solved_with_tool(i: int, question: str, expression: str, result: str) -> list[LLMMessage]:
        call = FunctionCall(id=f"call_{i}", name="calculator", arguments=f'{{"expression": "{expression}"}}')
        return [
            UserMessage(content=question, source="user"),
            AssistantMessage(content=[call], source="solver"),
            FunctionExecutionResultMessage(
                content=[FunctionExecutionResult(content=result, name="calculator", call_id=call.id, is_error=False)]
            ),
            AssistantMessage(content=f"{expression} = {result}. <answer>{result}</answer>", source="solver"),
        ]

    return [
        *solved_with_tool(0, "Bob buys 4 bags with 6 nuts in each bag. How many nuts is that?", "4 * 6", "24"),
        *solved_with_tool(1, "Kim had 23 cups and gave 9 of them away. How many cups are left?", "23 - 9", "14"),
        UserMessage(content="Ann has 3 pens. Ann gets 5 more. How many pens does Ann have now?", source="user"),
        AssistantMessage(content="3 + 5 = 8. <answer>8</answer>", source="solver"),
    ]


def final_answer(text: str) -> float | None:
    """The number inside the last ``<answer>...</answer>`` of a reply, or None."""
    start = text.rfind("<answer>")
    end = text.find("</answer>", start)
    if start < 0 or end < 0:
        return None
    return parse_number(text[start + len("<answer>") : end])


def reward(text: str, gold: float) -> float:
    """1.0 for the right number in ``<answer>`` tags (relative tolerance 1e-4), 0.1 for a wrong one, else 0."""
    value = final_answer(text)
    if value is None:
        return 0.0
    return 1.0 if abs(value - gold) <= 1e-6 + 1e-4 * abs(gold) else 0.1


async def calc_agent(task: dict[str, Any], resources: Any) -> float:
    """Answer ``task["question"]`` with an AssistantAgent; the reward checks ``task["answer"]``."""
    llm = resources.llm
    client = OpenAIChatCompletionClient(
        model=llm.model, base_url=llm.base_url, api_key=llm.api_key or "none", model_info=MODEL_INFO, max_retries=0
    )
    solver = AssistantAgent(
        "solver",
        model_client=client,
        tools=[CALCULATOR],
        reflect_on_tool_use=True,
        system_message=SYSTEM,
        model_context=UnboundedChatCompletionContext(initial_messages=few_shot()),
    )
    try:
        result = await solver.run(task=task["question"])
    finally:
        await client.close()
    return reward(result.messages[-1].to_text(), float(task["answer"]))
