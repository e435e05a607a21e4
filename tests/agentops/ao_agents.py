"""Agents instrumented the way AgentOps' users do it: ``agentops.init()`` without an API key (a
user trying AgentOps locally, :func:`init_agentops`) and AgentOps' decorators around plain OpenAI
client code (:mod:`openai_calc`)."""

from __future__ import annotations

from typing import Any

import openai_calc as calc
from agentops.sdk.decorators import agent, tool, workflow
from openai import OpenAI
from openai_calc import calc_backend, calc_tasks, client_for, score

from agentbolt import types as t

__all__ = ["calc_agent", "calc_backend", "calc_tasks", "calc_team", "init_agentops"]


def init_agentops() -> Any:
    """``agentops.init()`` without an API key, and an in-memory exporter on AgentOps' provider
    (what the user's own processors would see); returns the exporter."""
    import agentops
    from agentops.sdk.core import tracer
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    agentops.init()
    exporter = InMemorySpanExporter()
    assert tracer.provider is not None
    tracer.provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


@tool(name="calculator")
def calculator(expression: str) -> str:
    return calc.evaluate(expression)


@agent(name="solver")
def solve(client: OpenAI, model: str, question: str) -> str:
    return calc.solve(client, model, question, calculator)


@agent(name="checker")
def check(client: OpenAI, model: str, question: str, answer: str) -> bool:
    return calc.check(client, model, question, answer)


@workflow(name="calc")
def calc_agent(task: dict[str, Any], resources: t.Resources) -> float:
    """The solver: a calculator call, then the answer (two LLM calls)."""
    client, model = client_for(resources)
    return score(solve(client, model, task["question"]), task["answer"])


@workflow(name="calc_team")
def calc_team(task: dict[str, Any], resources: t.Resources) -> float:
    """The solver, then the checker (three LLM calls)."""
    client, model = client_for(resources)
    answer = solve(client, model, task["question"])
    return score(answer, task["answer"]) if check(client, model, task["question"], answer) else 0.0
