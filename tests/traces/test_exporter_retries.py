"""The real OTLP exporters' own retries: while the store is unavailable, ``agentbolt ingest`` answers
503 (HTTP) / ``UNAVAILABLE`` (gRPC), which the exporters retry with backoff; once the store is
back, every span is stored exactly once."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from agentbolt import types as t
from agentbolt.errors import StoreUnavailableError
from agentbolt.store.base import Store
from agentbolt.testing.fake_llm import FakeTokenizer
from agentbolt.traces import IngestOptions, IngestThread, SpanTranslation, TraceIngestor


class Flaky:
    """A store whose first ``failures`` span writes fail as an unreachable store's do."""

    def __init__(self, store: Store, failures: int) -> None:
        self._store = store
        self.failures = failures
        self.refused = 0

    async def add_spans(self, spans: Any) -> int:
        if self.refused < self.failures:
            self.refused += 1
            raise StoreUnavailableError("the database is restarting")
        return await self._store.add_spans(spans)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def exporter(protocol: str, thread: IngestThread) -> Any:
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as Grpc

        return Grpc(endpoint=thread.grpc_endpoint, insecure=True, timeout=30)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http

    return Http(endpoint=f"{thread.http_url}/v1/traces", timeout=30)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_exporter_retries_while_the_store_is_unavailable_store_each_span_once(protocol: str) -> None:
    flaky: list[Flaky] = []

    def make(store: Store) -> TraceIngestor:
        flaky.append(Flaky(store, failures=2))
        return TraceIngestor(
            flaky[0],  # type: ignore[arg-type]
            "prod",
            translation=SpanTranslation(FakeTokenizer()),
            options=IngestOptions(quiet_s=0.0),
        )

    with IngestThread("memory://", make) as thread:
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter(protocol, thread)))
        tracer = provider.get_tracer("agent")
        with tracer.start_as_current_span("solver", attributes={"openinference.span.kind": "AGENT"}) as root:
            pass  # one export: refused twice, then stored
        provider.shutdown()
        trace_id = format(root.get_span_context().trace_id, "032x")

        async def read(ingestor: TraceIngestor) -> tuple[list[dict[str, Any]], list[t.Span]]:
            await ingestor.complete_all()
            spans = await ingestor.store.query_spans([f"prod:trace:{trace_id}"])
            return ingestor.status(), spans[f"prod:trace:{trace_id}"]

        (row,), spans = thread.call(read)
    assert flaky[0].refused == 2
    assert len(spans) == 1 and row["spans"] == 1 and row["state"] == "complete"
