"""OpenInference set up by the agent's own code keeps working under agentbolt, whichever sets the
tracer provider first: its exporter and agentbolt both receive the spans, every LLM call is
captured once with exact ids and joined to OpenInference's span, agent and tool names arrive,
and no connection leaves the machine."""

from __future__ import annotations

import textwrap
from pathlib import Path

import instrumented_harness
import pytest

SCRIPT = textwrap.dedent(
    """
    import instrumented_harness

    def setup():  # what a Phoenix user writes (phoenix.otel.register does the same)
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        from openinference.instrumentation.smolagents import SmolagentsInstrumentor

        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        SmolagentsInstrumentor().instrument(tracer_provider=provider)
        return lambda: [s.name for s in exporter.get_finished_spans()]

    def load():
        import oi_agents as oa
        return oa.calc_team, oa.calc_backend(), oa.calc_tasks(2)

    instrumented_harness.main(setup, load, order={order!r})
    """
)


@pytest.mark.parametrize("order", ["before", "after"])
def test_instrumentation_before_or_after_agentbolt(order: str) -> None:
    summary = instrumented_harness.run(SCRIPT.format(order=order), Path(__file__).parent)
    assert summary["outbound"] == []
    assert summary["failed"] == 0
    # The user's exporter still receives OpenInference's spans.
    assert {"manager.run", "solver.run", "OpenAIModel.generate", "SimpleTool"} <= set(summary["user_exporter"])
    for rollout in summary["rollouts"]:
        assert rollout["status"] == "succeeded" and rollout["reward"] == 1.0
        assert rollout["gateway_calls"] == rollout["llm_spans"] == rollout["llm_spans_joined"] == 4
        assert rollout["attempt_ok"]
        assert rollout["agents"] == ["manager", "solver"]
        assert rollout["tools"] == ["calculator", "final_answer"]
        assert rollout["adapters"] == ["openinference"]
    assert [name for name, _ in summary["transitions"]] == ["manager", "solver", "solver", "manager"] * 2
    assert {source for _, source in summary["transitions"]} == {"exact"}
