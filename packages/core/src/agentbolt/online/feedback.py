"""Feedback: a reward for a session or one response, minutes or days after the calls.

``POST /v1/feedback`` with a :class:`Feedback` body::

    {"feedback_id": "fb-81", "session_id": "chat-42", "reward": 1.0}
    {"feedback_id": "fb-82", "response_id": "chatcmpl-9", "reward": -1, "dimensions": {"helpful": 0}}

becomes a reward span (``agentbolt.reward``) of the session's attempt, the same record an agent's
``emit_reward`` makes, so LightningRL reads it as it reads any reward:

- feedback on a session is its **final reward** (the episode return; a client's latest one
  wins), on every segment of the session;
- feedback on a response is an **intermediate reward** of that call (``target_response_id``)
  unless ``final: true`` makes it the return of the call's session segment.

It is **idempotent**: the span id is derived from ``feedback_id``, so a repeated request stores
nothing new and answers ``duplicate``. Feedback ids are **unique across the run**: the same id
with other content, or for another session or response, is refused (409, naming the first use)
and changes nothing. A client's final reward beats a judge's whatever order they arrive in (the
store's rule, :mod:`agentbolt.reward_precedence`). The answer says whether the reward will be
trained: ``recorded``, or ``recorded_not_trained`` when an update already consumed the session.
It is **validated** before anything is written: an unknown session or response is a 404, a
reward that is not a number (``true``, ``"1"``, an object, a list), not finite, beyond ``1e15``
in magnitude or outside the serve config's ``reward_range`` a 422 (or clipped, with
``reward_out_of_range="clip"``): :mod:`agentbolt.reward_validation`. Judges record their scores
the same way (``source: judge``).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping, Sequence
from typing import Annotated, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, model_validator

from .. import semconv
from .. import types as t
from ..reward_spans import feedback_reward_span
from ..reward_validation import RewardBounds, RewardDimensionsField, RewardField, RewardRefused
from ..store.base import Store
from .sessions import FeedbackUse, Session, SessionBook

__all__ = [
    "Feedback",
    "FeedbackConflict",
    "FeedbackResult",
    "FeedbackUse",
    "RewardRefused",
    "UnknownTarget",
    "record_feedback",
    "reward_span",
]

_BODY = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, use_attribute_docstrings=True)
_Id = Annotated[str, Field(min_length=1, max_length=256)]


class Feedback(BaseModel):
    """``POST /v1/feedback``: a reward for a session or for one response."""

    model_config = _BODY

    feedback_id: _Id
    """Your id for this feedback (e.g. a UUID): sending it again is harmless (idempotent)."""
    session_id: _Id | None = None
    """The session (the ``X-Agentbolt-Session-Id`` of its answers). Give this or ``response_id``."""
    response_id: _Id | None = None
    """The ``id`` of one response (Chat Completions ``chatcmpl-...``, Responses ``resp_...``,
    Messages ``msg_...``)."""
    reward: RewardField
    """The reward: a finite number of magnitude at most 1e15 (no ``true``, no ``"1"``), within the
    serve config's ``reward_range`` when one is declared; the scale is yours, keep it consistent."""
    dimensions: RewardDimensionsField = Field(default_factory=dict)
    """Further named scores (finite), kept with the reward for analysis."""
    final: bool | None = None
    """Whether this is the episode's return: always for a session; for a response, ``true``
    makes it the return of that response's session (default: a reward of that call only)."""
    comment: Annotated[str, Field(max_length=4000)] | None = None
    """Free text kept with the reward."""

    @model_validator(mode="after")
    def _one_target(self) -> Feedback:
        if (self.session_id is None) == (self.response_id is None):
            raise ValueError("give exactly one of session_id or response_id")
        if self.session_id is not None and self.final is False:
            raise ValueError("feedback on a session is its final reward; final=false applies to a response_id only")
        return self

    @property
    def is_final(self) -> bool:
        return self.session_id is not None or bool(self.final)

    def fingerprint(self) -> str:
        """A hash of the content (the id included): equal for a repeated request."""
        return hashlib.sha256(orjson.dumps(self.model_dump(), option=orjson.OPT_SORT_KEYS)).hexdigest()[:32]


class FeedbackResult(BaseModel):
    """The answer to ``POST /v1/feedback``."""

    model_config = ConfigDict(frozen=True)

    feedback_id: str
    status: Literal["recorded", "recorded_not_trained", "duplicate"]
    """``recorded``: stored, and the next update trains on it. ``recorded_not_trained``: stored,
    but an update already consumed the session (``detail`` says which), so no update trains on it.
    ``duplicate``: this feedback id was recorded before, with the same content; nothing changed."""
    session_id: str
    """The session the reward belongs to."""
    rollout_ids: list[str]
    """The session segments (rollouts) that carry it."""
    detail: str | None = None
    """Why a reward is not trained (``session already trained in version N``)."""


class UnknownTarget(LookupError):
    """The feedback names a session or response the serve process does not know."""


class FeedbackConflict(ValueError):
    """The feedback id was recorded before with other content."""


def span_id_for(feedback_id: str) -> str:
    """The reward span id of a feedback id (16 hex digits, the same on every retry)."""
    return hashlib.sha256(f"agentbolt-feedback:{feedback_id}".encode()).hexdigest()[:16]


def reward_span(
    session: Session,
    *,
    feedback_id: str,
    reward: float,
    final: bool,
    source: str,
    dimensions: Mapping[str, float] | None = None,
    response_id: str | None = None,
    comment: str | None = None,
    fingerprint: str | None = None,
) -> t.Span:
    """The reward span recording one feedback (or judge score) on one session segment
    (:func:`~agentbolt.reward_spans.feedback_reward_span`; span id :func:`span_id_for`)."""
    return feedback_reward_span(
        session.rollout_id,
        session.attempt_id,
        span_id=span_id_for(feedback_id),
        feedback_id=feedback_id,
        reward=reward,
        source=source,
        final=final,
        dimensions=dimensions,
        response_id=response_id,
        comment=comment,
        fingerprint=fingerprint,
    )


def targets(book: SessionBook, feedback: Feedback) -> list[Session]:
    """The session segments a feedback applies to; raises :class:`UnknownTarget`."""
    if feedback.session_id is not None:
        segments = book.session_segments(feedback.session_id)
        if not segments:
            raise UnknownTarget(
                f"unknown session {feedback.session_id!r}: use the X-Agentbolt-Session-Id of its answers "
                "(sessions beyond the serve process's retention are forgotten)"
            )
        return segments
    assert feedback.response_id is not None
    session = book.of_response(feedback.response_id)
    if session is None:
        raise UnknownTarget(
            f"unknown response id {feedback.response_id!r}: use the id of a response this server gave "
            "(the `id` field of the completion)"
        )
    return [session]


async def record_feedback(
    store: Store,
    book: SessionBook,
    feedback: Feedback,
    *,
    source: str = "client",
    trained_in: Mapping[str, int | None] | None = None,
    bounds: RewardBounds | None = None,
) -> FeedbackResult:
    """Store ``feedback`` as reward spans (see the module docstring); raises
    :class:`UnknownTarget`, :class:`FeedbackConflict` or :class:`RewardRefused` (outside
    ``bounds``, the declared reward range), having changed nothing.

    ``trained_in`` maps the rollout ids of sessions an update consumed to the live version that
    update started from (``None`` when unknown): a reward on them is ``recorded_not_trained``.
    """
    if bounds is not None:
        reward, clipped = bounds.check(feedback.reward, "reward")
        if clipped:
            feedback = feedback.model_copy(update={"reward": reward})
    segments = targets(book, feedback)
    fingerprint = feedback.fingerprint()
    target = (
        f"session {feedback.session_id!r}" if feedback.session_id is not None else f"response {feedback.response_id!r}"
    )
    async with book.feedback_lock(feedback.feedback_id):
        first = book.feedback_uses.get(feedback.feedback_id)
        if first is not None and first.fingerprint != fingerprint:
            raise FeedbackConflict(
                f"feedback id {feedback.feedback_id!r} was {first.describe()}, with other content; "
                "feedback ids are unique across the run: use a new feedback_id for a new reward"
            )
        result = await _write(store, segments, feedback, fingerprint, source)
        if first is None:
            book.feedback_uses[feedback.feedback_id] = FeedbackUse(fingerprint, segments[0].key, target, time.time())
    trained = {r: trained_in[r] for r in result.rollout_ids if trained_in is not None and r in trained_in}
    if result.status == "recorded" and trained and feedback.is_final:
        versions = sorted({v for v in trained.values() if v is not None})
        where = f"in version {', '.join(map(str, versions))}" if versions else "by an earlier update"
        result = result.model_copy(
            update={"status": "recorded_not_trained", "detail": f"session already trained {where}"}
        )
    return result


async def _write(
    store: Store, segments: Sequence[Session], feedback: Feedback, fingerprint: str, source: str
) -> FeedbackResult:
    spans = [
        reward_span(
            s,
            feedback_id=feedback.feedback_id,
            reward=feedback.reward,
            final=feedback.is_final,
            source=source,
            dimensions=feedback.dimensions,
            response_id=feedback.response_id,
            comment=feedback.comment,
            fingerprint=fingerprint,
        )
        for s in segments
    ]
    ids = [s.rollout_id for s in segments]
    existing = await _stored(store, ids, spans[0].span_id)
    if existing and any(fp != fingerprint for fp in existing.values()):
        raise FeedbackConflict(
            f"feedback id {feedback.feedback_id!r} was recorded before with other content; "
            "use a new feedback_id for a new reward"
        )
    added = await store.add_spans([s for s in spans if s.rollout_id not in existing])
    key = segments[0].key
    status: Literal["recorded", "duplicate"] = "duplicate" if existing and added == 0 else "recorded"
    if added < len(spans) - len(existing):  # a concurrent request with the same id won the race
        stored = await _stored(store, ids, spans[0].span_id)
        if any(fp != fingerprint for fp in stored.values()):
            raise FeedbackConflict(f"feedback id {feedback.feedback_id!r} was just recorded with other content")
        status = "duplicate"
    return FeedbackResult(feedback_id=feedback.feedback_id, status=status, session_id=key, rollout_ids=ids)


async def _stored(store: Store, rollout_ids: Sequence[str], span_id: str) -> dict[str, str]:
    """Rollout id -> fingerprint of the span ``span_id`` where it is already stored."""
    found: dict[str, str] = {}
    spans = await store.query_spans(rollout_ids)
    for rollout_id, items in spans.items():
        for span in items:
            if span.span_id == span_id:
                found[rollout_id] = str(span.attributes.get(semconv.FEEDBACK_FINGERPRINT, ""))
    return found
