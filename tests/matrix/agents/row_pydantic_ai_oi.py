"""pydantic-ai traced for Phoenix, as OpenInference documents it: pydantic-ai's own
instrumentation (``Agent.instrument_all()``) with OpenInference's ``OpenInferenceSpanProcessor``
on the tracer provider, which adds OpenInference's attributes to pydantic-ai's spans. The agent is
:mod:`row_pydantic_ai_otel`'s."""

from __future__ import annotations

from typing import Any

import row_pydantic_ai_otel

from agentbolt import types as t

STREAMING = False


def setup() -> None:
    from openinference.instrumentation.pydantic_ai import OpenInferenceSpanProcessor
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from pydantic_ai import Agent

    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):  # the user's own provider, when none is set yet
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(OpenInferenceSpanProcessor())
    Agent.instrument_all()


async def agent(task: dict[str, Any], resources: t.Resources) -> float:
    row_pydantic_ai_otel.STREAMING = STREAMING
    return await row_pydantic_ai_otel.agent(task, resources)
