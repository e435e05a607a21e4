"""A deployed agent as its users write it: the calculator agent of ``tests/openai_calc.py`` with a
plain ``openai`` client talking to a model server directly (here the fake backend, never the
gateway), instrumented with OpenInference or OpenLLMetry, exporting its traces with the real
OTLP exporter (HTTP or gRPC) to wherever ``--endpoint`` says: ``agentbolt ingest``.

    python traced_agent.py --flavor openinference --protocol grpc --endpoint 127.0.0.1:4317 \
        --base-url http://127.0.0.1:8000/v1 --tasks 3 [--session chat-1] [--chaos SEED]

``--chaos SEED``: the spans are held until the end, then sent by the same exporter in shuffled
batches of random sizes, every batch twice (what an exporter's retry after a lost answer does)
and the batches out of order. Prints one JSON line: the trace ids, how many spans were
exported (unique), how many were LLM spans.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: openai_calc

import openai_calc as calc
from openai import OpenAI
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult


class Chaos(SpanExporter):
    """Holds every span, then sends them in shuffled, duplicated batches through ``real``."""

    def __init__(self, real: SpanExporter, seed: int) -> None:
        self.real = real
        self.rng = random.Random(seed)
        self.spans: list[ReadableSpan] = []
        self.sent = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS

    def flush_chaos(self) -> None:
        if self.sent:
            return
        self.sent = True
        spans = list(self.spans)
        self.rng.shuffle(spans)
        batches = []
        while spans:
            size = self.rng.randint(1, 4)
            batches.append(spans[:size])
            spans = spans[size:]
        sends = [b for b in batches for _ in range(2)]
        self.rng.shuffle(sends)
        for batch in sends:
            assert self.real.export(batch) == SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.flush_chaos()
        self.real.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def exporter_for(protocol: str, endpoint: str) -> SpanExporter:
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        return GrpcExporter(endpoint=endpoint, insecure=True)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    return HttpExporter(endpoint=endpoint)


class Counting(SpanExporter):
    """Counts what goes through (unique spans, LLM spans, trace ids) and passes it on."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner
        self.ids: set[int] = set()
        self.llm: set[int] = set()
        self.traces: list[str] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        for s in spans:
            ctx = s.get_span_context()
            self.ids.add(ctx.span_id)
            attrs = s.attributes or {}
            if attrs.get("openinference.span.kind") == "LLM" or s.name == "openai.chat":
                self.llm.add(ctx.span_id)
            trace = format(ctx.trace_id, "032x")
            if trace not in self.traces:
                self.traces.append(trace)
        return self.inner.export(spans)

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


def run_openinference(args: argparse.Namespace, exporter: SpanExporter) -> None:
    from openinference.instrumentation import TracerProvider, using_session
    from openinference.instrumentation.openai import OpenAIInstrumentor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource({"service.name": "calc-prod"}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    OpenAIInstrumentor().instrument(tracer_provider=provider)
    tracer = provider.get_tracer("calc-prod")

    @tracer.tool(name="calculator")
    def calculator(expression: str) -> str:
        return calc.evaluate(expression)

    @tracer.agent(name="solver")
    def solver(question: str) -> str:
        return calc.solve(client, "fake-model", question, calculator)

    client = OpenAI(base_url=args.base_url, api_key="x", max_retries=0)
    for task in calc.calc_tasks(args.tasks):
        if args.session:
            with using_session(args.session):
                solver(task["question"])
        else:
            solver(task["question"])
    provider.shutdown()


def run_openllmetry(args: argparse.Namespace, exporter: SpanExporter) -> None:
    from traceloop.sdk import Traceloop
    from traceloop.sdk.decorators import agent, tool
    from traceloop.sdk.instruments import Instruments

    Traceloop.init(
        app_name="calc-prod",
        exporter=exporter,
        disable_batch=False,
        instruments={Instruments.OPENAI},
        telemetry_enabled=False,
    )

    @tool(name="calculator")
    def calculator(expression: str) -> str:
        return calc.evaluate(expression)

    @agent(name="solver")
    def solver(question: str) -> str:
        return calc.solve(client, "fake-model", question, calculator)

    client = OpenAI(base_url=args.base_url, api_key="x", max_retries=0)
    for task in calc.calc_tasks(args.tasks):
        if args.session:
            Traceloop.set_association_properties({"session_id": args.session})
        solver(task["question"])
    from opentelemetry import trace

    provider: Any = trace.get_tracer_provider()
    provider.force_flush()
    provider.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--flavor", choices=["openinference", "openllmetry"], required=True)
    parser.add_argument("--protocol", choices=["http", "grpc"], required=True)
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--tasks", type=int, default=2)
    parser.add_argument("--session")
    parser.add_argument("--chaos", type=int)
    args = parser.parse_args()
    real = exporter_for(args.protocol, args.endpoint)
    chaos = Chaos(real, args.chaos) if args.chaos is not None else None
    counting = Counting(chaos if chaos is not None else real)
    (run_openinference if args.flavor == "openinference" else run_openllmetry)(args, counting)
    if chaos is not None:
        chaos.flush_chaos()
    print(json.dumps({"traces": counting.traces, "spans": len(counting.ids), "llm_spans": len(counting.llm)}))


if __name__ == "__main__":
    main()
