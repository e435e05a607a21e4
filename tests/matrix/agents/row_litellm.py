"""A LiteLLM-based agent: a tool loop on ``litellm.completion`` (``stream=True`` when
streaming), traced with OpenLLMetry as its users do without a Traceloop account
(``Traceloop.init`` with their own exporter; ``@agent`` / ``@tool`` name the agent and the tool).
LiteLLM fetches its model price list from GitHub at import unless
``LITELLM_LOCAL_MODEL_COST_MAP=True`` (its documented offline switch), which this agent sets."""

from __future__ import annotations

import json
import os
from typing import Any

import calc

from agentbolt import types as t

STREAMING = False
_EXPORTER: Any = None


def setup() -> None:
    global _EXPORTER
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from traceloop.sdk import Traceloop

    _EXPORTER = InMemorySpanExporter()
    Traceloop.init(app_name="calc", exporter=_EXPORTER, disable_batch=True)


def _decorators() -> tuple[Any, Any]:
    from traceloop.sdk.decorators import agent as ol_agent
    from traceloop.sdk.decorators import tool

    return ol_agent, tool


def agent(task: dict[str, Any], resources: t.Resources) -> float:
    import litellm

    assert resources.llm is not None
    ol_agent, tool = _decorators()

    @tool(name="calculator")
    def calculator(expression: str) -> str:
        return calc.calculator(expression)

    @ol_agent(name="solver")
    def solve(question: str) -> str:
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": calc.SYSTEM_PROMPT},
            {"role": "user", "content": question},
        ]
        for _ in range(3):
            response = litellm.completion(
                model=f"openai/{resources.llm.model}",
                api_base=resources.llm.base_url,
                api_key="x",
                messages=messages,
                tools=[calc.OPENAI_TOOL],
                stream=STREAMING,
            )
            if STREAMING:
                response = litellm.stream_chunk_builder(list(response), messages=messages)
            message = response.choices[0].message
            if not message.tool_calls:
                return str(message.content or "")
            messages.append(message.model_dump(exclude_none=True))
            for call in message.tool_calls:
                result = calculator(**json.loads(call.function.arguments))
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
        return ""

    return calc.score(solve(task["question"]), task["answer"])
