"""LlamaIndex: a ``FunctionAgent`` named ``solver`` with a calculator tool on
llama-index-llms-openai's ``OpenAI`` (streaming is FunctionAgent's default; ``streaming=False``
turns it off), instrumented as its users do for Phoenix: OpenInference's
``LlamaIndexInstrumentor().instrument()``."""

from __future__ import annotations

from typing import Any

import calc
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.llms.openai import OpenAI

from agentbolt import types as t

STREAMING = False


def setup() -> None:
    from openinference.instrumentation.llama_index import LlamaIndexInstrumentor

    LlamaIndexInstrumentor().instrument()


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression such as 12 * 7."""
    return calc.calculator(expression)


async def agent(task: dict[str, Any], resources: t.Resources) -> float:
    assert resources.llm is not None
    llm = OpenAI(model="gpt-4o-mini", api_base=resources.llm.base_url, api_key="x", max_retries=0)
    solver = FunctionAgent(
        name="solver",
        description="Solves arithmetic with the calculator.",
        tools=[calculator],
        llm=llm,
        system_prompt=calc.SYSTEM_PROMPT,
        streaming=STREAMING,
    )
    result = await solver.run(user_msg=task["question"])
    return calc.score(str(result), task["answer"])
