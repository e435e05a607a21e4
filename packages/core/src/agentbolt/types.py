"""The data interface: what flows between algorithms, the store, runners and LightningRL.

Tasks, rollouts, attempts, resources and transitions are defined here; spans in
:mod:`agentbolt.spans` and the field types in :mod:`agentbolt.fields`, both re-exported, so
``from agentbolt.types import X`` works for every public name. Every model is a frozen
pydantic v2 model that round-trips through JSON. Timestamps of
rollouts and attempts are Unix seconds (float); span times are Unix nanoseconds (int), as in
OpenTelemetry. Statuses are ``str`` enums, so they serialize as plain strings.
"""

from __future__ import annotations

import enum
import traceback as traceback_module  # the name traceback is a field of ErrorInfo
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, Field

from .fields import (
    FROZEN,
    FROZEN_ANY_FLOAT,
    INT64_MAX,
    INT64_MIN,
    Attributes,
    AttributeValue,
    Int64,
    Json,
    JsonDict,
    NonNegInt64,
    new_id,
)
from .spans import Span, SpanEvent, SpanId, SpanKind, SpanLink, SpanStatus, StatusCode, TraceId, span_body_json

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "Attempt",
    "AttemptStatus",
    "AttributeValue",
    "Attributes",
    "Claim",
    "ErrorInfo",
    "ErrorKind",
    "Int64",
    "Json",
    "JsonDict",
    "LLMEndpoint",
    "NonNegInt64",
    "Page",
    "Resources",
    "Rollout",
    "RolloutMode",
    "RolloutSpec",
    "RolloutStatus",
    "Span",
    "SpanEvent",
    "SpanId",
    "SpanKind",
    "SpanLink",
    "SpanStatus",
    "StatusCode",
    "Task",
    "TokenSource",
    "TraceId",
    "Transition",
    "new_id",
    "span_body_json",
]

T = TypeVar("T")

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

    model_config = FROZEN

    task_id: str
    """Stable id of the task; GRPO groups rollouts of the same task within a step."""
    input: Json = None
    """The agent's input, any JSON value (a question, a dict of fields, ...)."""
    metadata: JsonDict = Field(default_factory=dict)
    """Free-form data kept with the task (gold answers, sources, ...)."""


class ErrorInfo(BaseModel):
    """What went wrong with an attempt or a rollout."""

    model_config = FROZEN

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
        return cls(
            kind=kind,
            type=type(exc).__qualname__,
            message=str(exc),
            traceback="".join(traceback_module.format_exception(type(exc), exc, exc.__traceback__)),
        )


class RolloutSpec(BaseModel):
    """What a caller enqueues. The store turns it into a :class:`Rollout`."""

    model_config = FROZEN

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
    """The training/evaluation run that enqueued it (see :mod:`agentbolt.store.run_records`), if any."""
    step: int | None = None
    """The run's step the rollout belongs to, if any."""

    @classmethod
    def from_task(cls, task: Task, **kwargs: Any) -> RolloutSpec:
        """A spec running ``task``: its id, input and (a copy of its) metadata; keyword arguments
        set the other fields, or replace these."""
        return cls(**{"task_id": task.task_id, "input": task.input, "metadata": dict(task.metadata), **kwargs})


class Rollout(BaseModel):
    """One run of the agent on a task, possibly over several attempts."""

    model_config = FROZEN

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

    model_config = FROZEN

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

    model_config = FROZEN

    rollout: Rollout
    """The rollout, status ``running``."""
    attempt: Attempt
    """The new attempt, status ``running``, with its lease."""


class Page(BaseModel, Generic[T]):
    """One page of a query; pass ``next_cursor`` back to get the next."""

    model_config = FROZEN

    items: list[T]
    """The results."""
    next_cursor: str | None = None
    """Opaque cursor of the next page; ``None`` on the last page."""


# --------------------------------------------------------------------------------------------
# Resources
# --------------------------------------------------------------------------------------------


class LLMEndpoint(BaseModel):
    """How an agent reaches the policy: an OpenAI-compatible endpoint and sampling settings."""

    model_config = FROZEN

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

    model_config = FROZEN

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
# Transitions (LightningRL's output)
# --------------------------------------------------------------------------------------------


class Transition(BaseModel):
    """One LLM call as a reinforcement-learning step: the state (prompt tokens), the action
    (response tokens) with its logprobs, and the credit it was assigned."""

    model_config = FROZEN_ANY_FLOAT

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
