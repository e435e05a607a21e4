"""The data interface: what flows between algorithms, the store, runners and LightningRL.

Every model is a frozen pydantic v2 model that round-trips through JSON. Timestamps of
rollouts and attempts are Unix seconds (float); span times are Unix nanoseconds (int), as in
OpenTelemetry. Statuses are ``str`` enums, so they serialize as plain strings.
"""

from __future__ import annotations

import enum
import math
import os
import secrets
import time
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Generic, TypeVar

import orjson
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    StringConstraints,
    ValidationError,
    WithJsonSchema,
)

from . import semconv
from .errors import SchemaError

__all__ = [
    "Attempt",
    "AttemptStatus",
    "AttributeValue",
    "Claim",
    "ErrorInfo",
    "ErrorKind",
    "LLMEndpoint",
    "Page",
    "Resources",
    "Rollout",
    "RolloutMode",
    "RolloutSpec",
    "RolloutStatus",
    "Span",
    "SpanEvent",
    "SpanKind",
    "SpanLink",
    "SpanStatus",
    "StatusCode",
    "Task",
    "TokenSource",
    "Transition",
    "new_id",
    "span_body_json",
]

T = TypeVar("T")

AttributeValue = str | bool | int | float | list[str] | list[bool] | list[int] | list[float]
"""An OpenTelemetry attribute value: a primitive or a homogeneous list of primitives."""

_PRIMITIVES = (str, bool, int, float)


def _check_attributes(attrs: dict[str, Any]) -> dict[str, Any]:
    """Validate OpenTelemetry attribute values (checked in Python: a pydantic union of eight
    list/primitive types costs five times more to validate and serialize)."""
    for key, value in attrs.items():
        if type(value) in _PRIMITIVES:
            if type(value) is float and not math.isfinite(value):
                raise ValueError(f"attribute {key!r} is {value}: only finite numbers can be stored")
            if type(value) is int and not -(2**63) <= value < 2**63:
                raise ValueError(f"attribute {key!r} is {value}, beyond 64 bits: send it as a string")
            continue
        if isinstance(value, tuple):
            value = attrs[key] = list(value)
        if isinstance(value, list):
            if not value:
                continue
            kinds = {type(v) for v in value}
            if float in kinds and not all(math.isfinite(v) for v in value if type(v) is float):
                raise ValueError(
                    f"attribute {key!r} holds non-finite numbers (NaN or infinity): only finite numbers can be stored"
                )
            if int in kinds and not all(-(2**63) <= v < 2**63 for v in value if type(v) is int):
                raise ValueError(f"attribute {key!r} holds integers beyond 64 bits: send them as strings")
            if len(kinds) == 1 and kinds <= set(_PRIMITIVES):
                continue
            if kinds <= {int, float}:  # e.g. logprobs [0, -0.5]: a float list
                attrs[key] = [float(v) for v in value]
                continue
            raise ValueError(
                f"attribute {key!r}: a list must hold one primitive type (str, bool, int or float), "
                f"got {sorted(k.__name__ for k in kinds)}"
            )
        if isinstance(value, _PRIMITIVES):  # subclasses such as str enums
            attrs[key] = _PRIMITIVES[[isinstance(value, p) for p in _PRIMITIVES].index(True)](value)
            continue
        raise ValueError(
            f"attribute {key!r}: {type(value).__name__} is not an OpenTelemetry attribute value; "
            "use str, bool, int, float or a list of one of them (JSON-encode structured values)"
        )
    return attrs


_ATTRIBUTE_SCHEMA = {
    "type": "object",
    "additionalProperties": {
        "anyOf": [
            {"type": "string"},
            {"type": "boolean"},
            {"type": "integer"},
            {"type": "number"},
            {"type": "array", "items": {"type": "string"}},
            {"type": "array", "items": {"type": "boolean"}},
            {"type": "array", "items": {"type": "integer"}},
            {"type": "array", "items": {"type": "number"}},
        ]
    },
}

Attributes = Annotated[dict[str, Any], AfterValidator(_check_attributes), WithJsonSchema(_ATTRIBUTE_SCHEMA)]
"""A mapping of attribute names to :data:`AttributeValue` values."""

_FROZEN = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)
"""Models that are stored or travel between processes: floats must be finite (a NaN lease is
never swept, a NaN reward poisons training)."""
_FROZEN_ANY_FLOAT = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)
"""Computed models (transitions) whose floats may be infinite, e.g. a logprob of ``-inf``."""

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
"""An integer that fits a 64-bit column (databases and JSON encoders refuse larger ones)."""
NonNegInt64 = Annotated[int, Field(ge=0, le=INT64_MAX)]
"""A non-negative :data:`Int64` (timestamps in nanoseconds, counters, sequence numbers)."""


def _check_json(value: Any, where: str = "value") -> Any:
    """Refuse JSON values a store cannot keep: integers beyond 64 bits, NaN and infinities."""
    stack = [value]
    while stack:
        item = stack.pop()
        if type(item) is int:
            if not INT64_MIN <= item <= INT64_MAX:
                raise ValueError(f"{where} holds the integer {item}, beyond 64 bits; send it as a string")
        elif type(item) is float:
            if not math.isfinite(item):
                raise ValueError(f"{where} holds {item}: only finite numbers can be stored")
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return value


Json = Annotated[JsonValue, AfterValidator(_check_json)]
"""A JSON value a store can keep: 64-bit integers, finite numbers."""
JsonDict = Annotated[dict[str, JsonValue], AfterValidator(_check_json)]
"""A JSON object a store can keep."""


def new_id(prefix: str = "") -> str:
    """A random, URL-safe id (16 hex chars of randomness) with an optional prefix like ``ro-``."""
    return f"{prefix}{secrets.token_hex(8)}"


# --------------------------------------------------------------------------------------------
# Statuses
# --------------------------------------------------------------------------------------------


class RolloutStatus(enum.StrEnum):
    """Lifecycle of a rollout. ``succeeded``, ``failed`` and ``cancelled`` are final."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_final(self) -> bool:
        """True for a status a rollout never leaves."""
        return self in _FINAL_ROLLOUT


_FINAL_ROLLOUT = frozenset({RolloutStatus.SUCCEEDED, RolloutStatus.FAILED, RolloutStatus.CANCELLED})


class AttemptStatus(enum.StrEnum):
    """Lifecycle of one attempt at a rollout. Everything but ``running`` is final."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    LOST = "lost"

    @property
    def is_final(self) -> bool:
        """True once the attempt has ended."""
        return self is not AttemptStatus.RUNNING


class RolloutMode(enum.StrEnum):
    """Whether a rollout feeds training or only evaluation."""

    TRAIN = "train"
    VAL = "val"


class ErrorKind(enum.StrEnum):
    """Why an attempt or rollout failed; decides whether the store retries it."""

    AGENT = "agent"
    """The agent raised. Not retried: the traceback is the user's to read."""
    INFRASTRUCTURE = "infrastructure"
    """The gateway, the inference backend or the runner failed. Retried while attempts remain."""
    TIMEOUT = "timeout"
    """The attempt ran past the rollout's ``timeout_s``. Not retried."""
    LOST = "lost"
    """The worker stopped renewing its lease (crashed, killed, partitioned). Retried."""
    CANCELLED = "cancelled"
    """The rollout was cancelled by a caller."""


class TokenSource(enum.StrEnum):
    """How an LLM call's token ids were obtained."""

    EXACT = "exact"
    """Returned by the inference backend: the ids the policy actually saw and sampled."""
    RETOKENIZED = "retokenized"
    """Reconstructed by tokenizing text: may differ from what the policy sampled."""
    MISSING = "missing"
    """No token ids available: the call cannot be trained on."""


# --------------------------------------------------------------------------------------------
# Tasks, rollouts, attempts
# --------------------------------------------------------------------------------------------


class Task(BaseModel):
    """One item of a dataset: what the agent is asked to do."""

    model_config = _FROZEN

    task_id: str
    """Stable id of the task; GRPO groups rollouts of the same task within a step."""
    input: Json = None
    """The agent's input, any JSON value (a question, a dict of fields, ...)."""
    metadata: JsonDict = Field(default_factory=dict)
    """Free-form data kept with the task (gold answers, sources, ...)."""


class ErrorInfo(BaseModel):
    """What went wrong with an attempt or a rollout."""

    model_config = _FROZEN

    kind: ErrorKind
    """Category; decides retries (see :class:`ErrorKind`)."""
    type: str
    """Exception class name or short error code, e.g. ``ValueError`` or ``timeout``."""
    message: str
    """Human-readable description."""
    traceback: str | None = None
    """Formatted traceback, when the error was an exception."""

    @classmethod
    def from_exception(cls, exc: BaseException, kind: ErrorKind = ErrorKind.AGENT) -> ErrorInfo:
        """Record an exception, with its formatted traceback."""
        import traceback as tb

        return cls(
            kind=kind,
            type=type(exc).__qualname__,
            message=str(exc),
            traceback="".join(tb.format_exception(type(exc), exc, exc.__traceback__)),
        )


class RolloutSpec(BaseModel):
    """What a caller enqueues. The store turns it into a :class:`Rollout`."""

    model_config = _FROZEN

    rollout_id: str | None = None
    """Caller-supplied id; enqueueing the same id twice is idempotent. Generated when omitted."""
    task_id: str | None = None
    """The task this rollout runs."""
    input: Json = None
    """The agent's input (normally the task's input)."""
    mode: RolloutMode = RolloutMode.TRAIN
    """``train`` or ``val``."""
    group_id: str | None = None
    """Rollouts of the same task in the same step share a group id; GRPO normalizes within it."""
    resources_version: NonNegInt64 | None = None
    """Resources version the rollout must run with; ``None`` means the latest at dequeue time."""
    max_attempts: int = Field(default=3, ge=1, le=100)
    """How many attempts infrastructure failures may use before the rollout fails."""
    timeout_s: float | None = Field(default=None, gt=0)
    """Wall-clock limit of each attempt, enforced by the store; ``None`` means no limit."""
    metadata: JsonDict = Field(default_factory=dict)
    """Free-form data kept with the rollout."""
    run_id: str | None = None
    """The training/evaluation run that enqueued it (see :mod:`agentbolt.runs`), if any."""
    step: int | None = None
    """The run's step the rollout belongs to, if any."""

    @classmethod
    def from_task(cls, task: Task, **kwargs: Any) -> RolloutSpec:
        """A spec running ``task``; keyword arguments set the other fields."""
        return cls(task_id=task.task_id, input=task.input, **kwargs)


class Rollout(BaseModel):
    """One run of the agent on a task, possibly over several attempts."""

    model_config = _FROZEN

    rollout_id: str
    """Unique id."""
    task_id: str | None = None
    """The task this rollout runs."""
    input: Json = None
    """The agent's input."""
    mode: RolloutMode = RolloutMode.TRAIN
    """``train`` or ``val``."""
    group_id: str | None = None
    """Group for advantage normalization (same task, same step)."""
    resources_version: NonNegInt64 | None = None
    """Resources version pinned at enqueue, or the version the current attempt was given."""
    status: RolloutStatus = RolloutStatus.QUEUED
    """Current status."""
    attempt_count: NonNegInt64 = 0
    """Attempts started so far."""
    max_attempts: Int64 = 3
    """Attempts allowed for infrastructure failures."""
    timeout_s: float | None = None
    """Per-attempt wall-clock limit in seconds."""
    final_reward: float | None = None
    """The episode's final reward, when one was reported."""
    error: ErrorInfo | None = None
    """Why the rollout failed (final status ``failed``/``cancelled``), else ``None``."""
    current_attempt_id: str | None = None
    """The latest attempt, if any was started."""
    created_at: float = 0.0
    """Enqueue time (Unix seconds)."""
    started_at: float | None = None
    """Start of the first attempt."""
    ended_at: float | None = None
    """When the rollout reached a final status."""
    updated_at: float = 0.0
    """Last change."""
    metadata: JsonDict = Field(default_factory=dict)
    """Free-form data given at enqueue."""
    run_id: str | None = None
    """The run that enqueued it, if any."""
    step: int | None = None
    """The run's step the rollout belongs to, if any."""

    def matches_spec(self, spec: RolloutSpec) -> bool:
        """True when ``spec`` describes this rollout (used for idempotent enqueue)."""
        return (
            self.task_id == spec.task_id
            and self.input == spec.input
            and self.mode == spec.mode
            and self.group_id == spec.group_id
            and self.max_attempts == spec.max_attempts
            and self.timeout_s == spec.timeout_s
            and self.run_id == spec.run_id
            and self.step == spec.step
        )


class Attempt(BaseModel):
    """One try at a rollout by one worker, under a lease."""

    model_config = _FROZEN

    attempt_id: str
    """Unique id."""
    rollout_id: str
    """The rollout this attempt belongs to."""
    index: NonNegInt64
    """1 for the first attempt, 2 for the first retry, ..."""
    worker_id: str
    """Who holds the lease."""
    status: AttemptStatus = AttemptStatus.RUNNING
    """Current status."""
    lease_expires_at: float | None = None
    """The lease ends here unless renewed by a heartbeat; then the attempt is ``lost``."""
    deadline_at: float | None = None
    """Started + the rollout's ``timeout_s``; past it the attempt is ``timed_out``."""
    started_at: float = 0.0
    """Claim time."""
    heartbeat_at: float | None = None
    """Last heartbeat."""
    ended_at: float | None = None
    """When the attempt reached a final status."""
    error: ErrorInfo | None = None
    """Why it ended badly, else ``None``."""


class Claim(BaseModel):
    """A rollout a worker dequeued, with the attempt it now holds."""

    model_config = _FROZEN

    rollout: Rollout
    """The rollout, status ``running``."""
    attempt: Attempt
    """The new attempt, status ``running``, with its lease."""


class Page(BaseModel, Generic[T]):
    """One page of a query; pass ``next_cursor`` back to get the next."""

    model_config = _FROZEN

    items: list[T]
    """The results."""
    next_cursor: str | None = None
    """Opaque cursor of the next page; ``None`` on the last page."""


# --------------------------------------------------------------------------------------------
# Resources
# --------------------------------------------------------------------------------------------


class LLMEndpoint(BaseModel):
    """How an agent reaches the policy: an OpenAI-compatible endpoint and sampling settings."""

    model_config = _FROZEN

    base_url: str
    """OpenAI-compatible base URL ending in ``/v1``. For a running rollout it is already scoped
    to the rollout and attempt (``{gateway}/rollouts/{rid}/attempts/{aid}/v1``)."""
    model: str
    """Model name to send in requests."""
    api_key: str | None = None
    """Key to send, if the endpoint needs one."""
    sampling: JsonDict = Field(default_factory=dict)
    """Sampling parameters the gateway forces (temperature, top_p, max_tokens, ...)."""


class Resources(BaseModel):
    """A versioned snapshot an algorithm publishes and rollouts run with."""

    model_config = _FROZEN

    version: NonNegInt64 | None = None
    """Assigned by the store: 1, 2, 3, ... Rollouts pin the version they ran with."""
    llm: LLMEndpoint | None = None
    """The policy endpoint."""
    prompts: dict[str, str] = Field(default_factory=dict)
    """Named prompt templates."""
    extra: JsonDict = Field(default_factory=dict)
    """Anything else the agent needs."""
    created_at: float | None = None
    """Set by the store when added."""


# --------------------------------------------------------------------------------------------
# Spans
# --------------------------------------------------------------------------------------------


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

    model_config = _FROZEN

    code: StatusCode = StatusCode.UNSET
    """``UNSET``, ``OK`` or ``ERROR``."""
    message: str = ""
    """Description, for errors."""


class SpanEvent(BaseModel):
    """A timestamped event inside a span (e.g. an exception)."""

    model_config = _FROZEN

    name: str
    """Event name, e.g. ``exception``."""
    time_ns: NonNegInt64
    """Unix nanoseconds."""
    attributes: Attributes = Field(default_factory=dict)
    """Event attributes."""


class SpanLink(BaseModel):
    """A link from a span to another span, possibly in another trace."""

    model_config = _FROZEN

    trace_id: TraceId
    """Linked trace id, 32 lowercase hex characters."""
    span_id: SpanId
    """Linked span id, 16 lowercase hex characters."""
    attributes: Attributes = Field(default_factory=dict)
    """Link attributes."""


TraceId = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{32}$")]
"""A trace id: 32 lowercase hex characters (checked by pydantic-core, in Rust)."""
SpanId = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{16}$")]
"""A span id: 16 lowercase hex characters."""


class Span(BaseModel):
    """An OpenTelemetry-compatible span, attributed to a rollout and attempt.

    ``seq`` is assigned by the store on insert: it increases with every span stored for the
    rollout, so ordering never depends on the clocks of different machines.
    """

    model_config = _FROZEN

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
            trace_id=trace_id or os.urandom(16).hex(),
            span_id=span_id or os.urandom(8).hex(),
            parent_span_id=parent_span_id,
            name=name,
            kind=kind,
            start_time_ns=start,
            end_time_ns=start if end_time_ns is None else end_time_ns,
            status=status or SpanStatus(),
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
            rid, aid = _route(rollout_id, attempt_id, attributes, resource)
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


def _route(
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


# --------------------------------------------------------------------------------------------
# Transitions (LightningRL's output)
# --------------------------------------------------------------------------------------------


class Transition(BaseModel):
    """One LLM call as a reinforcement-learning step: the state (prompt tokens), the action
    (response tokens) with its logprobs, and the credit it was assigned."""

    model_config = _FROZEN_ANY_FLOAT

    rollout_id: str
    """Rollout the call belongs to."""
    attempt_id: str | None = None
    """Attempt the call belongs to (the rollout's final attempt)."""
    group_id: str | None = None
    """Advantage group (rollouts of the same task in the same step)."""
    task_id: str | None = None
    """Task of the rollout."""
    index: int
    """Order of the call within the rollout (0-based, in store ``seq`` order)."""
    agent_name: str | None = None
    """Agent that made the call (from the nearest enclosing agent span or the call itself)."""
    prompt_ids: list[int]
    """Prompt token ids exactly as the policy saw them."""
    response_ids: list[int]
    """Generated token ids."""
    response_logprobs: list[float] | None = None
    """Logprob of each response token under the sampling policy."""
    response_mask: list[int] | None = None
    """1 for tokens the policy generated, 0 for tokens it did not (merged trajectories);
    ``None`` means all ones."""
    reward: float | None = None
    """Credit assigned to this call."""
    advantage: float | None = None
    """Advantage computed across the group."""
    policy_version: int | None = None
    """Resources version that sampled the response."""
    span_id: str | None = None
    """The LLM-call span this transition came from."""
    token_source: TokenSource = TokenSource.EXACT
    """How the token ids were obtained."""
    finish_reason: str | None = None
    """Why generation stopped (``stop``, ``length``, ``tool_calls``)."""
    metadata: JsonDict = Field(default_factory=dict)
    """Free-form data (merged span ids, truncation notes, ...)."""
