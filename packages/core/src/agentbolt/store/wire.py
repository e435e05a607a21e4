"""The store server's wire format: request and response bodies, shared by server and client.

Every body is a JSON object; responses wrap their payload in a named field (``{"rollouts":
[...]}``) so fields can be added without breaking clients. Request models check types and
bounds once, at the edge (numbers finite, integers within 64 bits, limits and durations in
sensible ranges: a malformed request is a 422, never a 500) and reject unknown fields; the
store checks meaning (allowed status changes) and its errors travel back unchanged.
Importing this module is cheap (no FastAPI).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from .. import types as t

__all__ = [
    "ATTEMPT_HEADER",
    "ROLLOUT_HEADER",
    "TOKEN_ENV",
    "AddSpansRequest",
    "AddSpansResponse",
    "AttemptsResponse",
    "CancelRequest",
    "ClaimsResponse",
    "CountsResponse",
    "DequeueRequest",
    "EnqueueRequest",
    "ErrorBody",
    "ErrorResponse",
    "FinishRequest",
    "GetRolloutsRequest",
    "HealthResponse",
    "HeartbeatRequest",
    "LeaseSeconds",
    "Limit",
    "PurgeRequest",
    "PurgeResponse",
    "QuerySpansRequest",
    "ResourcesResponse",
    "RolloutResponse",
    "RolloutsResponse",
    "SpansResponse",
    "SweepResponse",
    "WaitRequest",
    "WaitResponse",
    "WaitSeconds",
]

TOKEN_ENV = "AGENTBOLT_STORE_TOKEN"
"""Environment variable holding the bearer token, read by ``agentbolt store serve`` and by the
``http://`` store client when no token is given."""

ROLLOUT_HEADER = "X-Agentbolt-Rollout-Id"
"""OTLP requests: rollout of spans that carry no ``agentbolt.rollout_id`` attribute."""
ATTEMPT_HEADER = "X-Agentbolt-Attempt-Id"
"""OTLP requests: attempt of spans whose rollout came from :data:`ROLLOUT_HEADER`."""

_WIRE = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)

MAX_LIMIT = 100_000
"""Largest page or claim size one request may ask for."""
MAX_LEASE_S = 7 * 24 * 3600.0
"""Longest lease (a week): longer ones would keep a dead worker's rollout for ever."""
MAX_WAIT_S = 365 * 24 * 3600.0
"""Longest wait a request may name (the server caps each request far lower anyway)."""

Limit = Annotated[int, Field(ge=1, le=MAX_LIMIT)]
"""How many items one request may claim or return."""
LeaseSeconds = Annotated[float, Field(gt=0, le=MAX_LEASE_S)]
"""A lease length in seconds: positive, at most a week."""
WaitSeconds = Annotated[float, Field(ge=0, le=MAX_WAIT_S)]
"""A wait in seconds: zero or more."""


class _Body(BaseModel):
    model_config = _WIRE


# -- requests -------------------------------------------------------------------------------------


class EnqueueRequest(_Body):
    """``POST /v1/rollouts``: queue rollouts (idempotent on ``rollout_id``)."""

    specs: list[t.RolloutSpec]
    """Rollouts to queue, in order. Give every spec a ``rollout_id`` to make retries safe."""


class GetRolloutsRequest(_Body):
    """``POST /v1/rollouts/get``: many rollouts by id."""

    rollout_ids: list[str]
    """Ids, answered in this order."""


class WaitRequest(_Body):
    """``POST /v1/rollouts/wait``: wait until every rollout is final."""

    rollout_ids: list[str]
    """Rollouts to wait for."""
    timeout: WaitSeconds | None = None
    """Seconds to wait; the server caps each request (``--max-wait``), so clients loop."""


class CancelRequest(_Body):
    """``POST /v1/rollouts/cancel``: cancel unfinished rollouts."""

    rollout_ids: list[str]
    """Rollouts to cancel."""
    reason: str = "cancelled by caller"
    """Recorded as the rollouts' error message."""


class PurgeRequest(_Body):
    """``POST /v1/rollouts/purge``: delete finished rollouts with their attempts and spans."""

    rollout_ids: list[str] | None = None
    """Delete these (each must be finished)."""
    older_than_s: Annotated[float, Field(ge=0, le=1e12)] | None = None
    """Delete rollouts that ended at least this many seconds ago."""


class DequeueRequest(_Body):
    """``POST /v1/rollouts/dequeue``: claim queued rollouts under a lease."""

    worker_id: str
    """Who claims; recorded on each attempt."""
    limit: Limit = 1
    """Claim at most this many."""
    lease_s: LeaseSeconds = 30.0
    """Lease length; heartbeats renew it."""
    mode: t.RolloutMode | None = None
    """Only ``train`` or only ``val`` rollouts."""
    wait_s: WaitSeconds = 0.0
    """Seconds to wait for work when none is queued; the server caps each request."""
    rollout_ids: Annotated[list[str], Field(max_length=500)] | None = None
    """Claim only among these rollouts (``null``: any queued rollout)."""


class HeartbeatRequest(_Body):
    """``POST /v1/attempts/heartbeat``: renew the leases of running attempts."""

    attempt_ids: list[str]
    """Attempts to renew; every one's state is returned."""
    lease_s: LeaseSeconds = 30.0
    """New lease length from now."""


class FinishRequest(_Body):
    """``POST /v1/attempts/finish``: report the end of an attempt."""

    attempt_id: str
    """The attempt."""
    status: t.AttemptStatus
    """``succeeded`` or ``failed``."""
    reward: float | None = None
    """The episode's final reward."""
    error: t.ErrorInfo | None = None
    """Why it failed; kind ``infrastructure`` requeues the rollout while attempts remain."""


class AddSpansRequest(_Body):
    """``POST /v1/spans``: store spans of many rollouts in one call (idempotent on span ids)."""

    spans: list[t.Span]
    """Spans, each with its ``rollout_id``."""


class QuerySpansRequest(_Body):
    """``POST /v1/spans/query``: the spans of many rollouts."""

    rollout_ids: list[str]
    """Rollouts whose spans to return."""
    latest_attempt_only: bool = False
    """Keep only spans of each rollout's current attempt (and spans without an attempt)."""
    after_seq: t.Int64 | None = None
    """Only spans with a larger ``seq``."""


# -- responses ------------------------------------------------------------------------------------


class RolloutsResponse(_Body):
    """Rollouts, in the order asked for."""

    rollouts: list[t.Rollout]
    """The rollouts."""


class RolloutResponse(_Body):
    """One rollout."""

    rollout: t.Rollout
    """The rollout."""


class WaitResponse(_Body):
    """Rollout states after a (bounded) wait."""

    rollouts: list[t.Rollout]
    """Current states, in the order asked for."""
    done: bool
    """True when every rollout is final; otherwise the client waits again."""


class ClaimsResponse(_Body):
    """Claimed rollouts, each with its new attempt."""

    claims: list[t.Claim]
    """The claims (empty when nothing was queued within the wait)."""


class AttemptsResponse(_Body):
    """Attempt states."""

    attempts: list[t.Attempt]
    """The attempts."""


class CountsResponse(_Body):
    """Rollouts per status."""

    counts: dict[t.RolloutStatus, int]
    """How many rollouts are in each status."""


class PurgeResponse(_Body):
    """Result of a purge."""

    purged: int
    """Rollouts deleted."""


class AddSpansResponse(_Body):
    """Result of a span write."""

    added: int
    """Spans that were new (spans stored before are skipped)."""


class SpansResponse(_Body):
    """Spans by rollout."""

    spans: dict[str, list[t.Span]]
    """Each rollout's spans in ``seq`` order."""


class ResourcesResponse(_Body):
    """A resources snapshot."""

    resources: t.Resources | None
    """The snapshot; ``null`` when the latest was asked for and none exists yet."""


class SweepResponse(_Body):
    """Result of a sweep."""

    ended: int
    """Attempts ended by due deadlines and expired leases."""


class HealthResponse(_Body):
    """``GET /v1/health`` (no token needed)."""

    status: str
    """``ok``."""
    version: str
    """agentbolt version of the server."""


class ErrorBody(_Body):
    """What went wrong."""

    type: str
    """Exception class (``NotFoundError``, ``StaleAttemptError``, ``ValidationError``, ...)."""
    message: str
    """Human-readable description; the client raises the same class with this message."""
    what: str | None = None
    """``NotFoundError`` only: the kind of id that was not found."""
    ids: JsonValue = None
    """``NotFoundError`` only: the ids that were not found."""


class ErrorResponse(_Body):
    """Body of every error response."""

    error: ErrorBody
    """The error."""
