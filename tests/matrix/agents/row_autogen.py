"""AutoGen AgentChat: an ``AssistantAgent`` named ``solver`` with a calculator tool and
``reflect_on_tool_use`` (the tool call, then the answer from its result); ``model_client_stream``
streams each call. agentbolt-autogen instruments it with no code for agentbolt."""

from __future__ import annotations

from typing import Any

import calc
from autogen_agentchat.agents import AssistantAgent
from autogen_ext.models.openai import OpenAIChatCompletionClient

from agentbolt import types as t

STREAMING = False
MODEL_INFO: Any = {
    "vision": False,
    "function_calling": True,
    "json_output": False,
    "family": "unknown",
    "structured_output": False,
}


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression such as 12 * 7."""
    return calc.calculator(expression)


def setup() -> None:
    """Nothing: the adapter hooks AgentChat itself."""


async def agent(task: dict[str, Any], resources: t.Resources) -> float:
    assert resources.llm is not None
    client = OpenAIChatCompletionClient(
        model=resources.llm.model, base_url=resources.llm.base_url, api_key="x", model_info=MODEL_INFO, max_retries=0
    )
    solver = AssistantAgent(
        "solver",
        model_client=client,
        tools=[calculator],
        reflect_on_tool_use=True,
        system_message=calc.SYSTEM_PROMPT,
        model_client_stream=STREAMING,
    )
    try:
        result = await solver.run(task=task["question"])
    finally:
        await client.close()
    return calc.score(str(result.messages[-1].to_text()), task["answer"])
