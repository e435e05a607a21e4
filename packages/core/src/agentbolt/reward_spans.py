"""The reward span of a reward given from outside the agent: a client's feedback, a judge's score
or a scoring function's reward, on a traced rollout (:mod:`agentbolt.traces`) or a served
session (:mod:`agentbolt.online`). Both record it the same way, so LightningRL and the store's
precedence rule (:mod:`agentbolt.reward_precedence`) read them alike."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import orjson

from . import semconv
from . import types as t

__all__ = ["feedback_reward_span"]


def feedback_reward_span(
    rollout_id: str,
    attempt_id: str,
    *,
    span_id: str,
    feedback_id: str,
    reward: float,
    source: str,
    final: bool = True,
    dimensions: Mapping[str, float] | None = None,
    response_id: str | None = None,
    comment: str | None = None,
    fingerprint: str | None = None,
) -> t.Span:
    """A reward span (``agentbolt.reward``) of ``rollout_id``'s attempt ``attempt_id``.

    ``span_id``: derived from ``feedback_id`` by the caller, so a retry stores nothing new;
    ``source``: ``client``, ``judge`` or ``agent`` (a scoring function); ``dimensions``: further
    named scores kept with ``reward`` (the primary); ``response_id``: the call an intermediate
    reward belongs to (ignored for a final one); ``comment`` and ``fingerprint`` (a hash of the
    feedback's content, to tell a repeated request from a conflicting one) are kept with it."""
    dims = {"reward": float(reward), **{k: float(v) for k, v in (dimensions or {}).items() if k != "reward"}}
    attrs: dict[str, Any] = {
        semconv.SPAN_KIND_ATTR: semconv.KIND_REWARD,
        semconv.REWARD_VALUE: float(reward),
        semconv.REWARD_PRIMARY: "reward",
        semconv.REWARD_DIMENSIONS: orjson.dumps(dims).decode(),
        semconv.REWARD_IS_FINAL: final,
        semconv.FEEDBACK_ID: feedback_id,
        semconv.FEEDBACK_SOURCE: source,
    }
    if response_id is not None and not final:
        attrs[semconv.REWARD_TARGET_RESPONSE_ID] = response_id
    if comment:
        attrs[semconv.FEEDBACK_COMMENT] = comment
    if fingerprint:
        attrs[semconv.FEEDBACK_FINGERPRINT] = fingerprint
    now = time.time_ns()
    return t.Span.create(
        semconv.SPAN_REWARD,
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        span_id=span_id,
        start_time_ns=now,
        end_time_ns=now,
        attributes=attrs,
    )
