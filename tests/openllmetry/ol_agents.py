"""Agents instrumented the way OpenLLMetry's users do it: the Traceloop SDK's decorators around
plain OpenAI client code (:mod:`openai_calc`), ``Traceloop.init`` with the user's own exporter
(:func:`init_traceloop`)."""

from __future__ import annotations

from typing import Any

import openai_calc as calc
from openai import OpenAI
from openai_calc import calc_backend, calc_tasks, client_for, score
from traceloop.sdk.decorators import agent, tool, workflow

from agentbolt import types as t

__all__ = ["calc_agent", "calc_backend", "calc_tasks", "calc_team", "init_traceloop"]


def init_traceloop() -> Any:
    """``Traceloop.init`` as a user without a Traceloop account writes it (their own exporter);
    returns the exporter."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from traceloop.sdk import Traceloop
    from traceloop.sdk.instruments import Instruments

    exporter = InMemorySpanExporter()
    Traceloop.init(app_name="calc", exporter=exporter, disable_batch=True, instruments={Instruments.OPENAI})
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
