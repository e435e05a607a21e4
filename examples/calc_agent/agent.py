"""The calculator agent: an AutoGen AgentChat ``AssistantAgent`` with a ``calculator`` tool.

Plain AutoGen code: the agent reads only ``resources.llm`` (base URL, model name, key) and returns
the reward. The model decides whether to call the calculator; after a tool result it is called
again (with the tool still offered) and either calls the calculator again -- a chain of up to
``MAX_TOOL_ITERATIONS`` steps -- or writes the answer. Should it still be calling the tool after
the last iteration, ``reflect_on_tool_use`` asks it once more, without tools, for the answer.
There are no worked examples in the prompt: a 135M model given only the tool's schema rarely
calls it, and that is what SFT on demonstrations, then RL, teach (``train.py``).
"""

from __future__ import annotations

from typing import Any

from autogen_agentchat.agents import AssistantAgent
from autogen_core.models import ModelInfo
from autogen_core.tools import FunctionTool
from autogen_ext.models.openai import OpenAIChatCompletionClient
from calculator import evaluate, format_number
from scoring import reward

SYSTEM = (
    "Solve the math word problem. You can use the calculator tool for arithmetic. "
    "Give the final answer as a number inside <answer>...</answer>."
)

MAX_TOOL_ITERATIONS = 4
"""Calculator calls one question may chain (each followed by a model call that sees the result)."""

MODEL_INFO = ModelInfo(
    vision=False, function_calling=True, json_output=False, family="unknown", structured_output=False
)


def calculator(expression: str) -> str:
    """Evaluate arithmetic with + - * / ** and parentheses, e.g. 4 * 6."""
    return format_number(evaluate(expression))


CALCULATOR = FunctionTool(calculator, name="calculator", description="Evaluate arithmetic, e.g. 4 * 6")


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
        max_tool_iterations=MAX_TOOL_ITERATIONS,
        system_message=SYSTEM,
    )
    try:
        result = await solver.run(task=task["question"])
    finally:
        await client.close()
    return reward(result.messages[-1].to_text(), float(task["answer"]))
