"""The store server's wire format: what the operations' requests and answers are made of.

The request and response bodies of each operation are derived from its declaration on
:class:`~agentbolt.store.Store` (:mod:`agentbolt.store.operations`): ``POST`` bodies and
``GET`` queries carry the arguments by name, and answers wrap their result in a named field
(``{"claims": [...]}``). This module holds what those declarations share: the bounds of numbers
(checked once, at the edge: numbers finite, integers within 64 bits, limits and durations in
sensible ranges, so a malformed request is a 422, never a 500), the default lease, headers,
and the bodies that are no operation's (errors, health). Importing it is cheap (no FastAPI).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field, JsonValue

from .. import types as t
from .operations import WIRE_CONFIG

__all__ = [
    "ATTEMPT_HEADER",
    "DEFAULT_LEASE_S",
    "MAX_LEASE_S",
    "MAX_LIMIT",
    "MAX_WAIT_S",
    "ROLLOUT_HEADER",
    "TOKEN_ENV",
    "AgeSeconds",
    "ErrorBody",
    "ErrorResponse",
    "HealthResponse",
    "LeaseSeconds",
    "Limit",
    "Version",
    "WaitSeconds",
]

TOKEN_ENV = "AGENTBOLT_STORE_TOKEN"
"""Environment variable holding the bearer token, read by ``agentbolt store serve`` and by the
``http://`` store client when no token is given."""

ROLLOUT_HEADER = "X-Agentbolt-Rollout-Id"
"""OTLP requests: rollout of spans that carry no ``agentbolt.rollout_id`` attribute."""
ATTEMPT_HEADER = "X-Agentbolt-Attempt-Id"
"""OTLP requests: attempt of spans whose rollout came from :data:`ROLLOUT_HEADER`."""

DEFAULT_LEASE_S = 30.0
"""Lease of a claim or heartbeat that names none (runners renew it every third of it)."""
MAX_LIMIT = 100_000
"""Largest page or claim size one call may ask for."""
MAX_LEASE_S = 7 * 24 * 3600.0
"""Longest lease (a week): longer ones would keep a dead worker's rollout for ever."""
MAX_WAIT_S = 365 * 24 * 3600.0
"""Longest wait a call may name (the server caps each request far lower anyway)."""

Limit = Annotated[int, Field(ge=1, le=MAX_LIMIT)]
"""How many items one call may claim or return."""
LeaseSeconds = Annotated[float, Field(gt=0, le=MAX_LEASE_S)]
"""A lease length in seconds: positive, at most a week."""
WaitSeconds = Annotated[float, Field(ge=0, le=MAX_WAIT_S)]
"""A wait in seconds: zero or more."""
AgeSeconds = Annotated[float, Field(ge=0, le=1e12)]
"""An age in seconds: zero or more."""
Version = Annotated[int, Field(ge=1, le=t.INT64_MAX)]
"""A resources version: 1, 2, 3, ..."""


class _Body(BaseModel):
    model_config = WIRE_CONFIG


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
