"""OTLP/HTTP trace ingest at /v1/traces: the real OTel exporter, protobuf and JSON, gzip, partial success."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import Callable

import httpx
import orjson
import pytest
from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode
from server_doubles import FaultyStore, specs

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.errors import StoreUnavailableError
from agentbolt.store.memory import MemoryStore
from agentbolt.store.server import ServerThread
from agentbolt.store.server.otlp_json import spans_to_otlp_json

Serve = Callable[..., ServerThread]
PROTOBUF = {"content-type": "application/x-protobuf"}
JSON = {"content-type": "application/json"}


@pytest.fixture
def backend() -> MemoryStore:
    store = MemoryStore(sweep_interval_s=0)
    asyncio.run(store.enqueue(specs(2)))
    return store


@pytest.fixture
def attempt_id(backend: MemoryStore) -> str:
    (claim,) = asyncio.run(backend.dequeue("w"))  # r0 runs; r1 stays queued
    return claim.attempt.attempt_id


def stored(backend: MemoryStore, rollout_id: str) -> list[t.Span]:
    return [s.model_copy(update={"seq": None}) for s in asyncio.run(backend.query_spans([rollout_id]))[rollout_id]]


def record(resource: dict[str, str], build: Callable[[TracerProvider], None]) -> list[ReadableSpan]:
    """Spans as the OTel SDK makes them (in memory, not exported)."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create(resource))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    build(provider)
    provider.shutdown()
    return list(memory.get_finished_spans())


def agent_run(provider: TracerProvider) -> None:
    tracer = provider.get_tracer("my.agent", "1.0")
    with tracer.start_as_current_span("invoke_agent solver", kind=SpanKind.SERVER) as root:
        root.set_attribute(semconv.GEN_AI_AGENT_NAME, "solver")
        with tracer.start_as_current_span("chat smollm", kind=SpanKind.CLIENT) as call:
            call.set_attribute(semconv.PROMPT_TOKEN_IDS, [1, 2, 3])
            call.set_attribute(semconv.RESPONSE_LOGPROBS, [-0.5, -1.25])
            call.set_attribute(semconv.GEN_AI_USAGE_INPUT_TOKENS, 3)
            call.set_attribute("agentbolt.llm.stream", True)
            call.add_event("retry", {"attempt": 1})
        with tracer.start_as_current_span("execute_tool calculator") as tool:
            tool.set_status(Status(StatusCode.ERROR, "division by zero"))


def test_the_opentelemetry_exporter_delivers_spans_gzipped_with_a_token(
    serve: Serve, backend: MemoryStore, attempt_id: str
) -> None:
    url = serve(backend, token="s3cret").url
    resource = {"service.name": "agent", semconv.ROLLOUT_ID: "r0", semconv.ATTEMPT_ID: attempt_id}
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create(resource))
    exporter = OTLPSpanExporter(
        endpoint=f"{url}/v1/traces", headers={"Authorization": "Bearer s3cret"}, compression=Compression.Gzip
    )
    provider.add_span_processor(BatchSpanProcessor(exporter))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    agent_run(provider)
    assert provider.force_flush(10_000)
    provider.shutdown()
    expected = [t.Span.from_otel(s) for s in memory.get_finished_spans()]
    got = stored(backend, "r0")
    assert sorted(got, key=lambda s: s.start_time_ns) == sorted(expected, key=lambda s: s.start_time_ns)
    assert {s.attempt_id for s in got} == {attempt_id}
    chat = next(s for s in got if s.name == "chat smollm")
    assert chat.attributes[semconv.PROMPT_TOKEN_IDS] == [1, 2, 3] and chat.kind is t.SpanKind.CLIENT
    assert chat.events[0].attributes == {"attempt": 1} and chat.scope == "my.agent"
    tool = next(s for s in got if s.name == "execute_tool calculator")
    assert tool.status == t.SpanStatus(code=t.StatusCode.ERROR, message="division by zero")


@pytest.mark.parametrize("encoding", ["protobuf", "protobuf-json", "otlp-json"])
@pytest.mark.parametrize("gzipped", [False, True])
def test_every_encoding_stores_the_same_spans(
    serve: Serve, backend: MemoryStore, attempt_id: str, encoding: str, gzipped: bool, http: httpx.Client
) -> None:
    url = serve(backend).url
    readable = record({semconv.ROLLOUT_ID: "r0", semconv.ATTEMPT_ID: attempt_id}, agent_run)
    expected = [t.Span.from_otel(s) for s in readable]
    if encoding == "protobuf":
        body, headers = encode_spans(readable).SerializeToString(), dict(PROTOBUF)
    elif encoding == "protobuf-json":  # protobuf's JSON mapping: base64 ids, int64 as strings
        body, headers = json_format.MessageToJson(encode_spans(readable)).encode(), dict(JSON)
    else:  # agentbolt's own OTLP/JSON encoder: hex ids
        body, headers = orjson.dumps(spans_to_otlp_json(expected)), dict(JSON)
    if gzipped:
        body, headers["content-encoding"] = gzip.compress(body), "gzip"
    response = http.post(url + "/v1/traces", content=body, headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == headers["content-type"]
    if encoding == "protobuf":
        assert not ExportTraceServiceResponse.FromString(response.content).HasField("partial_success")
    else:
        assert response.json() == {}
    got = stored(backend, "r0")
    key = lambda s: s.span_id  # noqa: E731
    if encoding == "otlp-json":  # the resource carries the routing ids, as spans_to_otlp_json puts them
        got = [s.model_copy(update={"resource": {}}) for s in got]
        expected = [s.model_copy(update={"resource": {}}) for s in expected]
    assert sorted(got, key=key) == sorted(expected, key=key)


def _mixed_batch(attempt_id: str) -> ExportTraceServiceRequest:
    """Two good spans (r0), and one each: no rollout id, unknown rollout, unknown attempt, malformed."""
    good = record({semconv.ROLLOUT_ID: "r0", semconv.ATTEMPT_ID: attempt_id}, agent_run)[:2]

    def one(name: str, **attributes: str) -> Callable[[TracerProvider], None]:
        def build(provider: TracerProvider) -> None:
            with provider.get_tracer("t").start_as_current_span(name, attributes=attributes):
                pass

        return build

    bad = (
        record({}, one("orphan"))
        + record({semconv.ROLLOUT_ID: "ghost"}, one("ghostly"))
        + record({}, one("wrong attempt", **{semconv.ROLLOUT_ID: "r1", semconv.ATTEMPT_ID: "at-nope"}))
        + record({semconv.ROLLOUT_ID: "r0"}, one("mangled"))
    )
    request = encode_spans(good + bad)
    for rs in request.resource_spans:
        for ss in rs.scope_spans:
            for span in ss.spans:
                if span.name == "mangled":
                    span.trace_id = b"\x01\x02"
    return request


@pytest.mark.parametrize("fmt", ["protobuf", "json"])
def test_partial_success_rejects_unroutable_spans_and_keeps_the_rest(
    serve: Serve, backend: MemoryStore, attempt_id: str, fmt: str, http: httpx.Client
) -> None:
    url = serve(backend).url
    request = _mixed_batch(attempt_id)
    if fmt == "protobuf":
        response = http.post(url + "/v1/traces", content=request.SerializeToString(), headers=PROTOBUF)
        assert response.status_code == 200
        partial = ExportTraceServiceResponse.FromString(response.content).partial_success
        rejected, message = partial.rejected_spans, partial.error_message
    else:
        response = http.post(url + "/v1/traces", content=json_format.MessageToJson(request), headers=JSON)
        assert response.status_code == 200
        partial = response.json()["partialSuccess"]
        rejected, message = int(partial["rejectedSpans"]), partial["errorMessage"]
    assert rejected == 4
    for reason in ("no rollout id", "ghost", "at-nope", "mangled"):
        assert reason in message
    assert sorted(s.name for s in stored(backend, "r0")) == ["chat smollm", "execute_tool calculator"]
    assert stored(backend, "r1") == []


def test_headers_route_spans_that_carry_no_ids(
    serve: Serve, backend: MemoryStore, attempt_id: str, http: httpx.Client
) -> None:
    url = serve(backend).url
    readable = record({"service.name": "plain-otel-app"}, agent_run)
    headers = {**PROTOBUF, "X-Agentbolt-Rollout-Id": "r0", "X-Agentbolt-Attempt-Id": attempt_id}
    response = http.post(url + "/v1/traces", content=encode_spans(readable).SerializeToString(), headers=headers)
    assert response.status_code == 200
    got = stored(backend, "r0")
    assert len(got) == 3 and {s.attempt_id for s in got} == {attempt_id}


@pytest.fixture
def small_server(serve: Serve, backend: MemoryStore) -> str:
    return serve(backend, max_request_bytes=100_000).url


@pytest.mark.parametrize(
    ("body", "headers", "status"),
    [
        (b"\xff\xff\xff", PROTOBUF, 400),
        (b"{not json", JSON, 400),
        (b"[1, 2]", JSON, 400),
        (b'{"resourceSpans": "nope"}', JSON, 400),
        (b"garbage", {**PROTOBUF, "content-encoding": "gzip"}, 400),
        (gzip.compress(b"\0" * 1_000_000), {**PROTOBUF, "content-encoding": "gzip"}, 413),
        (b"{}", {**JSON, "content-encoding": "br"}, 415),
        (b"{}", {"content-type": "text/plain"}, 415),
    ],
)
def test_bad_exports_are_refused_with_a_status_body(
    small_server: str, body: bytes, headers: dict[str, str], status: int, http: httpx.Client
) -> None:
    response = http.post(small_server + "/v1/traces", content=body, headers=headers)
    assert response.status_code == status
    assert b"Traceback" not in response.content
    if response.headers["content-type"] == "application/json":
        status_body = response.json()
        assert status_body["message"] and status_body["error"]["message"] == status_body["message"]
    else:  # a protobuf google.rpc.Status: field 1 (code), field 2 (message)
        assert response.headers["content-type"] == "application/x-protobuf"
        assert response.content.startswith(b"\x08") and b"\x12" in response.content


def test_an_unavailable_store_answers_503_so_exporters_retry(serve: Serve, http: httpx.Client) -> None:
    backend = FaultyStore(add_spans=[StoreUnavailableError("database is locked")])
    asyncio.run(backend.enqueue(specs(1)))
    url = serve(backend).url
    body = encode_spans(record({semconv.ROLLOUT_ID: "r0"}, agent_run)).SerializeToString()
    response = http.post(url + "/v1/traces", content=body, headers=PROTOBUF)
    assert response.status_code == 503 and b"database is locked" in response.content
    assert http.post(url + "/v1/traces", content=body, headers=PROTOBUF).status_code == 200
