"""The data interface: JSON round trips, OpenTelemetry conversion, OTLP/JSON, validation."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry import trace as otel_trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import BaseModel, ValidationError

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.errors import SchemaError
from agentbolt.store.server.otlp_json import spans_from_otlp_json, spans_to_otlp_json


def _span(**kw: object) -> t.Span:
    return t.Span.create(
        "chat smollm",
        rollout_id="ro-1",
        attempt_id="at-1",
        attributes={
            semconv.GEN_AI_OPERATION_NAME: "chat",
            semconv.PROMPT_TOKEN_IDS: [1, 2, 3],
            semconv.RESPONSE_LOGPROBS: [-0.1, -2.5],
            "flag": True,
            "score": 0.5,
            "tags": ["a", "b"],
        },
        events=[t.SpanEvent(name="exception", time_ns=123, attributes={"exception.type": "ValueError"})],
        **kw,  # type: ignore[arg-type]
    )


EXAMPLES: list[BaseModel] = [
    t.Task(task_id="t1", input={"question": "2+2?"}, metadata={"answer": 4}),
    t.RolloutSpec(rollout_id="r1", task_id="t1", input="q", group_id="g", timeout_s=3.5, metadata={"k": [1, 2]}),
    t.Rollout(
        rollout_id="r1",
        status=t.RolloutStatus.FAILED,
        error=t.ErrorInfo(kind=t.ErrorKind.TIMEOUT, type="timeout", message="slow"),
        final_reward=0.25,
        created_at=1.5,
        updated_at=2.5,
    ),
    t.Attempt(
        attempt_id="a1", rollout_id="r1", index=2, worker_id="w", status=t.AttemptStatus.LOST, lease_expires_at=9.0
    ),
    t.Claim(
        rollout=t.Rollout(rollout_id="r"), attempt=t.Attempt(attempt_id="a", rollout_id="r", index=1, worker_id="w")
    ),
    t.Page[t.Rollout](items=[t.Rollout(rollout_id="r")], next_cursor="7"),
    t.Resources(
        version=3,
        llm=t.LLMEndpoint(base_url="http://127.0.0.1:9/v1", model="m", sampling={"temperature": 0.7}),
        prompts={"system": "hi"},
        extra={"x": None},
    ),
    _span(parent_span_id="00f067aa0ba902b7"),
    t.Transition(
        rollout_id="r1",
        index=0,
        prompt_ids=[1, 2],
        response_ids=[3],
        response_logprobs=[-0.5],
        response_mask=[1],
        reward=1.0,
        advantage=-0.5,
        token_source=t.TokenSource.RETOKENIZED,
    ),
]


@pytest.mark.parametrize("model", EXAMPLES, ids=lambda m: type(m).__name__)
def test_json_round_trip(model: BaseModel) -> None:
    text = model.model_dump_json()
    assert type(model).model_validate_json(text) == model
    assert type(model).model_validate(json.loads(text)) == model


def test_every_field_is_documented() -> None:
    models = (t.Task, t.RolloutSpec, t.Rollout, t.Attempt, t.Claim, t.ErrorInfo, t.Resources, t.LLMEndpoint)
    models += (t.Span, t.SpanEvent, t.SpanLink, t.SpanStatus, t.Transition)
    for model in models:
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no docstring"
        schema = model.model_json_schema()
        assert all("description" in p for p in schema["properties"].values())


def test_models_are_frozen_and_reject_unknown_fields() -> None:
    rollout = t.Rollout(rollout_id="r")
    with pytest.raises(ValidationError):
        rollout.status = t.RolloutStatus.RUNNING  # type: ignore[misc]
    with pytest.raises(ValidationError, match="extra"):
        t.RolloutSpec(rollout_id="r", unknown=1)  # type: ignore[call-arg]


def test_rollout_spec_from_task_carries_the_task() -> None:
    task = t.Task(task_id="q1", input={"question": "2+2?"}, metadata={"split": "train"})
    spec = t.RolloutSpec.from_task(task, rollout_id="r1", step=3)
    assert (spec.task_id, spec.input, spec.metadata, spec.rollout_id, spec.step) == (
        "q1",
        {"question": "2+2?"},
        {"split": "train"},
        "r1",
        3,
    )
    # keyword arguments replace what comes from the task
    assert t.RolloutSpec.from_task(task, metadata={"gate": 1}).metadata == {"gate": 1}


def test_statuses_are_str_enums() -> None:
    assert t.RolloutStatus.SUCCEEDED == "succeeded"
    assert t.RolloutStatus.SUCCEEDED.is_final and not t.RolloutStatus.RUNNING.is_final
    assert t.AttemptStatus.TIMED_OUT.is_final and not t.AttemptStatus.RUNNING.is_final
    assert json.loads(t.Rollout(rollout_id="r").model_dump_json())["status"] == "queued"


@pytest.mark.parametrize(
    ("attributes", "message"),
    [
        ({"x": None}, "not an OpenTelemetry attribute value"),
        ({"x": {"nested": 1}}, "not an OpenTelemetry attribute value"),
        ({"x": [1, "a"]}, "one primitive type"),
        ({"x": [[1]]}, "one primitive type"),
    ],
)
def test_malformed_attributes_are_rejected(attributes: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        t.Span.create("s", attributes=attributes)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), [0.5, float("-inf")]])
def test_non_finite_numbers_are_rejected(value: object) -> None:
    # orjson would write them as null, and the stored span could not be read back.
    with pytest.raises(ValidationError, match="finite"):
        t.Span.create("s", attributes={"x": value})  # type: ignore[dict-item]


def test_otlp_ids_come_in_pairs() -> None:
    span = t.Span.create("s", rollout_id="r-span", attempt_id=None)
    payload = spans_to_otlp_json([span])
    payload["resourceSpans"][0]["resource"]["attributes"] = [
        {"key": semconv.ROLLOUT_ID, "value": {"stringValue": "r-res"}},
        {"key": semconv.ATTEMPT_ID, "value": {"stringValue": "a-res"}},
    ]
    payload["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["attributes"] = [
        {"key": semconv.ROLLOUT_ID, "value": {"stringValue": "r-span"}}
    ]
    (back,) = spans_from_otlp_json(payload)
    assert (back.rollout_id, back.attempt_id) == ("r-span", None)  # never r-span with a-res


def test_attribute_normalisation() -> None:
    span = t.Span.create("s", attributes={"lp": [0, -0.5], "tup": (1, 2), "kind": t.TokenSource.EXACT})
    assert span.attributes["lp"] == [0.0, -0.5] and all(isinstance(v, float) for v in span.attributes["lp"])
    assert span.attributes["tup"] == [1, 2]
    assert span.attributes["kind"] == "exact" and type(span.attributes["kind"]) is str


@pytest.mark.parametrize("field", ["trace_id", "span_id", "parent_span_id"])
def test_bad_ids_are_rejected(field: str) -> None:
    data = json.loads(_span().model_dump_json())
    data[field] = "XYZ"
    with pytest.raises(ValidationError, match=field):
        t.Span.model_validate(data)


def _sdk_spans() -> list[object]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({semconv.ROLLOUT_ID: "ro-9", "service.name": "agent"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("agent.tests")
    with tracer.start_as_current_span("invoke_agent writer", kind=otel_trace.SpanKind.INTERNAL) as parent:
        parent.set_attribute(semconv.GEN_AI_AGENT_NAME, "writer")
        with tracer.start_as_current_span("chat m", kind=otel_trace.SpanKind.CLIENT) as child:
            child.set_attribute(semconv.PROMPT_TOKEN_IDS, [1, 2, 3])
            child.set_attribute(semconv.ROLLOUT_ID, "ro-own")
            child.set_attribute(semconv.ATTEMPT_ID, "at-own")
            child.add_event("note", {"k": "v"})
            child.set_status(otel_trace.Status(otel_trace.StatusCode.ERROR, "boom"))
    provider.shutdown()
    return list(exporter.get_finished_spans())


def test_from_real_otel_sdk_spans() -> None:
    child_sdk, parent_sdk = _sdk_spans()
    child = t.Span.from_otel(child_sdk)
    parent = t.Span.from_otel(parent_sdk, rollout_id="override", attempt_id="at-0")
    plain_parent = t.Span.from_otel(parent_sdk)
    assert (child.rollout_id, child.attempt_id) == ("ro-own", "at-own")  # the span's own attributes
    assert (plain_parent.rollout_id, plain_parent.attempt_id) == ("ro-9", None)  # the resource, as a pair
    assert (parent.rollout_id, parent.attempt_id) == ("override", "at-0")
    assert child.parent_span_id == parent.span_id and child.trace_id == parent.trace_id
    assert child.kind is t.SpanKind.CLIENT and child.status.code is t.StatusCode.ERROR
    assert child.status.message == "boom"
    assert child.attributes[semconv.PROMPT_TOKEN_IDS] == [1, 2, 3]
    assert child.events[0].name == "note" and child.events[0].attributes == {"k": "v"}
    assert child.resource["service.name"] == "agent" and child.scope == "agent.tests"
    assert child.end_time_ns is not None and child.end_time_ns >= child.start_time_ns
    assert t.Span.model_validate_json(child.model_dump_json()) == child


def test_otlp_json_round_trip() -> None:
    spans = [_span(), _span(parent_span_id="00f067aa0ba902b7"), t.Span.create("other", rollout_id="ro-2")]
    spans[2] = spans[2].model_copy(update={"links": [t.SpanLink(trace_id="1" * 32, span_id="2" * 16)]})
    payload = spans_json = spans_to_otlp_json(spans)
    assert len(spans_json["resourceSpans"]) == 2  # grouped by rollout/attempt
    resource_keys = {a["key"] for a in payload["resourceSpans"][0]["resource"]["attributes"]}
    assert {semconv.ROLLOUT_ID, semconv.ATTEMPT_ID} <= resource_keys
    decoded = spans_from_otlp_json(json.loads(json.dumps(payload)))
    by_id = {s.span_id: s for s in decoded}
    for original in spans:
        got = by_id[original.span_id]
        assert got.model_copy(update={"resource": {}}) == original.model_copy(update={"resource": {}})
        assert got.resource[semconv.ROLLOUT_ID] == original.rollout_id


def test_otlp_json_accepts_base64_ids_and_enum_names() -> None:
    import base64

    payload = {
        "resourceSpans": [
            {
                "resource": {"attributes": [{"key": semconv.ROLLOUT_ID, "value": {"stringValue": "r"}}]},
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "traceId": base64.b64encode(bytes(range(16))).decode(),
                                "spanId": base64.b64encode(bytes(range(8))).decode(),
                                "name": "x",
                                "kind": "SPAN_KIND_SERVER",
                                "startTimeUnixNano": "5",
                                "status": {"code": "STATUS_CODE_OK"},
                                "attributes": [{"key": "n", "value": {"intValue": "7"}}],
                            }
                        ]
                    }
                ],
            }
        ]
    }
    (span,) = spans_from_otlp_json(payload)
    assert span.trace_id == bytes(range(16)).hex() and span.span_id == bytes(range(8)).hex()
    assert span.kind is t.SpanKind.SERVER and span.status.code is t.StatusCode.OK
    assert span.attributes == {"n": 7} and span.rollout_id == "r"


@pytest.mark.parametrize(
    "payload",
    [
        [],
        {"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz", "spanId": "1" * 16, "name": "x"}]}]}]},
        {"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "1" * 32, "spanId": "1" * 16}]}]}]},
        {
            "resourceSpans": [
                {"scopeSpans": [{"spans": [{"traceId": "1" * 32, "spanId": "1" * 16, "name": "x", "kind": 99}]}]}
            ]
        },
    ],
)
def test_malformed_otlp_raises_schema_error(payload: object) -> None:
    with pytest.raises(SchemaError):
        spans_from_otlp_json(payload)  # type: ignore[arg-type]


def test_span_body_json_reads_back() -> None:
    span = _span()
    body = t.span_body_json(span)
    restored = t.Span.model_validate_json(body).model_copy(update={"rollout_id": "ro-1", "attempt_id": "at-1"})
    assert restored == span


def test_semconv_schema_version_on_spans() -> None:
    assert t.Span.create("s").schema_version == semconv.SCHEMA_VERSION
    assert semconv.SCHEMA_VERSION.count(".") == 1
    # Deprecated GenAI names are never defined.
    assert not any(v in ("gen_ai.prompt", "gen_ai.completion") for v in vars(semconv).values())


def test_error_info_from_exception_keeps_traceback() -> None:
    try:
        raise KeyError("missing tool")
    except KeyError as exc:
        info = t.ErrorInfo.from_exception(exc)
    assert info.kind is t.ErrorKind.AGENT and info.type == "KeyError"
    assert "missing tool" in info.message and "raise KeyError" in (info.traceback or "")


attribute_values = st.one_of(
    st.text(max_size=20),
    st.booleans(),
    st.integers(min_value=-(2**62), max_value=2**62),
    st.floats(allow_nan=False, allow_infinity=False),
    st.lists(st.integers(min_value=0, max_value=2**31), max_size=30),
    st.lists(st.text(max_size=5), max_size=5),
)


@given(st.dictionaries(st.text(min_size=1, max_size=15), attribute_values, max_size=8))
def test_span_attributes_round_trip_through_json_and_otlp(attributes: dict[str, object]) -> None:
    span = t.Span.create("prop", rollout_id="r", attributes=attributes)  # type: ignore[arg-type]
    assert t.Span.model_validate_json(span.model_dump_json()) == span
    (back,) = spans_from_otlp_json(json.loads(json.dumps(spans_to_otlp_json([span]))))
    assert back.attributes == span.attributes
