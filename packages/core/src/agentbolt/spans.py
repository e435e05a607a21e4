"""Spans: the OpenTelemetry-compatible records every part of agentbolt writes (the gateway's
LLM calls, adapters' agents and tools, rewards), attributed to a rollout and attempt, and their
compact JSON body as stores keep it. Re-exported by :mod:`agentbolt.types`."""

from __future__ import annotations

import enum
import random
import time
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

import orjson
from pydantic import BaseModel, Field, StringConstraints, ValidationError

from . import semconv
from .errors import SchemaError
from .fields import FROZEN, Attributes, AttributeValue, NonNegInt64

__all__ = [
    "Span",
    "SpanEvent",
    "SpanId",
    "SpanKind",
    "SpanLink",
    "SpanStatus",
    "StatusCode",
    "TraceId",
    "random_id",
    "rollout_route",
    "span_body_json",
]


class SpanKind(enum.StrEnum):
    """OpenTelemetry span kind."""

    INTERNAL = "INTERNAL"
    SERVER = "SERVER"
    CLIENT = "CLIENT"
    PRODUCER = "PRODUCER"
    CONSUMER = "CONSUMER"


class StatusCode(enum.StrEnum):
    """OpenTelemetry status code."""

    UNSET = "UNSET"
    OK = "OK"
    ERROR = "ERROR"


class SpanStatus(BaseModel):
    """Outcome of the operation a span describes."""

    model_config = FROZEN

    code: StatusCode = StatusCode.UNSET
    """``UNSET``, ``OK`` or ``ERROR``."""
    message: str = ""
    """Description, for errors."""


class SpanEvent(BaseModel):
    """A timestamped event inside a span (e.g. an exception)."""

    model_config = FROZEN

    name: str
    """Event name, e.g. ``exception``."""
    time_ns: NonNegInt64
    """Unix nanoseconds."""
    attributes: Attributes = Field(default_factory=dict)
    """Event attributes."""


class SpanLink(BaseModel):
    """A link from a span to another span, possibly in another trace."""

    model_config = FROZEN

    trace_id: TraceId
    """Linked trace id, 32 lowercase hex characters."""
    span_id: SpanId
    """Linked span id, 16 lowercase hex characters."""
    attributes: Attributes = Field(default_factory=dict)
    """Link attributes."""


_UNSET_STATUS = SpanStatus()
"""The status of a span that sets none (shared: statuses are frozen)."""

TraceId = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{32}$")]
"""A trace id: 32 lowercase hex characters (checked by pydantic-core, in Rust)."""
SpanId = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{16}$")]
"""A span id: 16 lowercase hex characters."""


class Span(BaseModel):
    """An OpenTelemetry-compatible span, attributed to a rollout and attempt.

    ``seq`` is assigned by the store on insert: it increases with every span stored for the
    rollout, so ordering never depends on the clocks of different machines.
    """

    model_config = FROZEN

    rollout_id: str | None = None
    """Rollout the span belongs to; required by the store."""
    attempt_id: str | None = None
    """Attempt the span belongs to."""
    seq: NonNegInt64 | None = None
    """Store-assigned, monotonic per rollout. ``None`` until stored."""
    trace_id: TraceId
    """32 lowercase hex characters."""
    span_id: SpanId
    """16 lowercase hex characters; unique within the rollout (writes are idempotent on it)."""
    parent_span_id: SpanId | None = None
    """Parent span id, or ``None`` for a root span."""
    name: str
    """Span name."""
    kind: SpanKind = SpanKind.INTERNAL
    """OpenTelemetry span kind: the role of the operation (client call, server handler, ...)."""
    start_time_ns: NonNegInt64
    """Unix nanoseconds."""
    end_time_ns: NonNegInt64 | None = None
    """Unix nanoseconds; ``None`` for a span that did not end."""
    status: SpanStatus = Field(default_factory=SpanStatus)
    """Outcome."""
    attributes: Attributes = Field(default_factory=dict)
    """Attributes, following :mod:`agentbolt.semconv`."""
    events: list[SpanEvent] = Field(default_factory=list)
    """Events in the span."""
    links: list[SpanLink] = Field(default_factory=list)
    """Links to other spans."""
    resource: Attributes = Field(default_factory=dict)
    """Resource attributes of the process that produced the span."""
    scope: str | None = None
    """Instrumentation scope (tracer) name."""
    schema_version: str = semconv.SCHEMA_VERSION
    """Version of :mod:`agentbolt.semconv` the span follows."""

    # -- constructors ---------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        name: str,
        *,
        attributes: Mapping[str, AttributeValue] | None = None,
        rollout_id: str | None = None,
        attempt_id: str | None = None,
        trace_id: str | None = None,
        span_id: str | None = None,
        parent_span_id: str | None = None,
        start_time_ns: int | None = None,
        end_time_ns: int | None = None,
        status: SpanStatus | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        events: Sequence[SpanEvent] = (),
    ) -> Span:
        """A new span with random ids; times default to now (a zero-length span)."""
        now = time.time_ns()
        start = now if start_time_ns is None else start_time_ns
        return cls(
            rollout_id=rollout_id,
            attempt_id=attempt_id,
            trace_id=trace_id or random_id(128),
            span_id=span_id or random_id(64),
            parent_span_id=parent_span_id,
            name=name,
            kind=kind,
            start_time_ns=start,
            end_time_ns=start if end_time_ns is None else end_time_ns,
            status=status or _UNSET_STATUS,
            attributes=dict(attributes or {}),
            events=list(events),
        )

    @classmethod
    def from_otel(
        cls,
        span: Any,
        *,
        rollout_id: str | None = None,
        attempt_id: str | None = None,
    ) -> Span:
        """Convert an OpenTelemetry SDK ``ReadableSpan``.

        The rollout and attempt ids default to the span's ``agentbolt.rollout_id`` /
        ``agentbolt.attempt_id`` attributes, then to its resource attributes.
        """
        try:
            ctx = span.get_span_context()
            attributes = _plain_attributes(span.attributes)
            resource = _plain_attributes(span.resource.attributes if span.resource else None)
            rid, aid = rollout_route(rollout_id, attempt_id, attributes, resource)
            scope = getattr(span, "instrumentation_scope", None)
            return cls(
                rollout_id=None if rid is None else str(rid),
                attempt_id=None if aid is None else str(aid),
                trace_id=format(ctx.trace_id, "032x"),
                span_id=format(ctx.span_id, "016x"),
                parent_span_id=format(span.parent.span_id, "016x") if span.parent else None,
                name=span.name,
                kind=SpanKind(span.kind.name),
                start_time_ns=span.start_time or 0,
                end_time_ns=span.end_time,
                status=SpanStatus(
                    code=StatusCode(span.status.status_code.name),
                    message=span.status.description or "",
                ),
                attributes=attributes,
                events=[
                    SpanEvent(name=e.name, time_ns=e.timestamp, attributes=_plain_attributes(e.attributes))
                    for e in span.events
                ],
                links=[
                    SpanLink(
                        trace_id=format(link.context.trace_id, "032x"),
                        span_id=format(link.context.span_id, "016x"),
                        attributes=_plain_attributes(link.attributes),
                    )
                    for link in span.links
                ],
                resource=resource,
                scope=scope.name if scope is not None else None,
            )
        except ValidationError as exc:
            raise SchemaError(f"OpenTelemetry span {getattr(span, 'name', '?')!r} is invalid: {exc}") from exc

    # -- conveniences ---------------------------------------------------------------------

    @property
    def duration_s(self) -> float | None:
        """End minus start in seconds, or ``None`` for an open span."""
        return None if self.end_time_ns is None else (self.end_time_ns - self.start_time_ns) / 1e9


def random_id(bits: int) -> str:
    """A random non-zero id of ``bits`` bits in lowercase hex, as OpenTelemetry's
    ``RandomIdGenerator`` makes them. ``random``, not ``os.urandom``: span ids need to be unique,
    not secret, and the system call behind ``os.urandom`` releases the GIL, so an agent thread
    beside the runner's busy event loop could wait a whole switch interval to get it back."""
    while True:
        value = random.getrandbits(bits)
        if value:
            return f"{value:0{bits // 4}x}"


def span_body_json(span: Span) -> str:
    """The span as compact JSON without ``seq``, ``rollout_id`` and ``attempt_id`` (stores keep
    those in columns). Built by hand and encoded with orjson: four times faster than pydantic's
    serializer, and span ingest is the store's hottest path. ``Span.model_validate_json``
    reads it back."""
    body: dict[str, Any] = {
        "trace_id": span.trace_id,
        "span_id": span.span_id,
        "parent_span_id": span.parent_span_id,
        "name": span.name,
        "kind": span.kind,
        "start_time_ns": span.start_time_ns,
        "end_time_ns": span.end_time_ns,
        "status": {"code": span.status.code, "message": span.status.message},
        "attributes": span.attributes,
        "schema_version": span.schema_version,
    }
    if span.events:
        body["events"] = [{"name": e.name, "time_ns": e.time_ns, "attributes": e.attributes} for e in span.events]
    if span.links:
        body["links"] = [{"trace_id": x.trace_id, "span_id": x.span_id, "attributes": x.attributes} for x in span.links]
    if span.resource:
        body["resource"] = span.resource
    if span.scope is not None:
        body["scope"] = span.scope
    return orjson.dumps(body).decode()


# --- conversion helpers for Span.from_otel ----------------------------------------------------


def rollout_route(
    rollout_id: str | None, attempt_id: str | None, attributes: Mapping[str, Any], resource: Mapping[str, Any]
) -> tuple[Any, Any]:
    """Rollout and attempt ids, taken together from one source: the arguments, else the span's
    attributes, else its resource (never a rollout from one place and an attempt from another)."""
    if rollout_id is not None:
        return rollout_id, attempt_id
    for source in (attributes, resource):
        if source.get(semconv.ROLLOUT_ID) is not None:
            return source.get(semconv.ROLLOUT_ID), source.get(semconv.ATTEMPT_ID)
    return None, None


def _plain_attributes(attrs: Mapping[str, Any] | None) -> dict[str, AttributeValue]:
    """OTel attributes (tuples, bounded dicts) as plain dicts of primitives and lists."""
    if not attrs:
        return {}
    return {k: list(v) if isinstance(v, tuple | list) else v for k, v in attrs.items()}
