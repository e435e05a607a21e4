"""Rewards for traced rollouts: feedback by trace or session id, judges, a scoring function.

Every reward is a reward span (``agentbolt.reward``) of the traced rollout's attempt, the record
an agent's ``emit_reward`` or ``agentbolt serve``'s feedback makes, so LightningRL and every
export read it as they read any reward; the store's precedence rule decides which final reward
counts (``client`` feedback > ``judge`` > ``agent``, whatever the order they arrive in:
:mod:`agentbolt.reward_precedence`).

- **Feedback** (:class:`TraceFeedback`, ``POST /v1/feedback`` of ``agentbolt ingest``): a reward
  for the rollout of a trace id or a session id, at any time (before or long after the trace
  completed), source ``client``. Idempotent: the span id is derived from ``feedback_id``.
- **Scoring function** (``scorer``): called once when a trace completes, with a
  :class:`TracedRollout` (its spans, translated, and the transcript); its number is the final
  reward, source ``agent`` (what the agent would have reported itself). ``None``: no reward.
- **Judge** (an :class:`agentbolt.rewards.LLMJudge`): scores the transcript when a trace
  completes, source ``judge``.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, model_validator

from .. import semconv
from .. import types as t
from ..reward_precedence import reward_source, winning_final
from ..reward_spans import feedback_reward_span
from ..reward_validation import RewardDimensionsField, RewardField, reward_number
from ..rewards.trajectory import Trajectory, trajectory_from_spans

__all__ = ["Scorer", "TraceFeedback", "TracedRollout", "reward_span", "rewards_of", "run_scorer"]


_Id = Annotated[str, Field(min_length=1, max_length=256)]


class TraceFeedback(BaseModel):
    """A reward for the rollout of one trace or one session (``POST /v1/feedback``)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, use_attribute_docstrings=True)

    feedback_id: _Id
    """Your id for this feedback: sending it again stores nothing new (idempotent)."""
    trace_id: _Id | None = None
    """The OpenTelemetry trace id (32 hex digits) of the traced run. Give this or ``session_id``."""
    session_id: _Id | None = None
    """The session attribute's value, when the ingest groups by session."""
    reward: RewardField
    """A finite number of magnitude at most 1e15 (no ``true``, no ``"1"``)."""
    final: bool = True
    """The episode's return (default). ``false``: an intermediate reward, kept for analysis and
    for credit assigners that read them (attached after the rollout's last call)."""
    dimensions: RewardDimensionsField = Field(default_factory=dict)
    """Further named scores, kept with the reward."""
    comment: Annotated[str, Field(max_length=4000)] | None = None
    """Free text kept with the reward."""

    @model_validator(mode="after")
    def _one_target(self) -> TraceFeedback:
        if (self.trace_id is None) == (self.session_id is None):
            raise ValueError("give exactly one of trace_id or session_id")
        if self.trace_id is not None:
            object.__setattr__(self, "trace_id", self.trace_id.lower())
        return self

    def fingerprint(self) -> str:
        """A hash of the content: equal for a repeated request."""
        return hashlib.sha256(orjson.dumps(self.model_dump(), option=orjson.OPT_SORT_KEYS)).hexdigest()[:32]


def reward_span(
    rollout_id: str,
    attempt_id: str,
    *,
    reward_id: str,
    reward: float,
    source: str,
    final: bool = True,
    dimensions: Mapping[str, float] | None = None,
    comment: str | None = None,
    fingerprint: str | None = None,
) -> t.Span:
    """A reward span of a traced rollout (:func:`~agentbolt.reward_spans.feedback_reward_span`);
    its span id is derived from ``reward_id`` (a retry stores nothing new)."""
    return feedback_reward_span(
        rollout_id,
        attempt_id,
        span_id=hashlib.sha256(f"agentbolt-trace-reward:{reward_id}".encode()).hexdigest()[:16],
        feedback_id=reward_id,
        reward=reward,
        source=source,
        final=final,
        dimensions=dimensions,
        comment=comment,
        fingerprint=fingerprint,
    )


@dataclass(frozen=True)
class TracedRollout:
    """What a scoring function sees when a trace completes."""

    rollout_id: str
    run_id: str
    key: str
    """The trace id, or the session value."""
    trace_ids: list[str]
    spans: list[t.Span]
    """The rollout's spans as stored (translated, LLM calls with their rebuilt ids), in ``seq`` order."""

    @property
    def trajectory(self) -> Trajectory:
        """The transcript of its LLM calls (what judges read)."""
        return trajectory_from_spans(self.spans, self.rollout_id)

    def attribute(self, name: str) -> Any:
        """The first value of a span attribute (or resource attribute) among its spans, root first."""
        for span in sorted(self.spans, key=lambda s: (s.parent_span_id is not None, s.seq or 0)):
            if name in span.attributes:
                return span.attributes[name]
            if name in span.resource:
                return span.resource[name]
        return None


Scorer = Callable[[TracedRollout], float | Awaitable[float | None] | None]
"""A user's scoring function over a completed trace (sync or async)."""


async def run_scorer(scorer: Scorer, rollout: TracedRollout) -> float | None:
    """The scorer's reward (``None``: it gave none); raises :class:`RewardRefused` for a value
    that is not a finite number within 1e15."""
    value = scorer(rollout)
    if inspect.isawaitable(value):
        value = await value
    if value is None:
        return None
    return reward_number(value, "the scorer's reward")


def rewards_of(spans: Sequence[t.Span]) -> tuple[float | None, str | None]:
    """The final reward that counts among ``spans`` and its source (precedence rule)."""
    best = winning_final((s, s.attributes) for s in spans)
    if best is None:
        return None, None
    value = best.attributes.get(semconv.REWARD_VALUE)
    return (float(value) if isinstance(value, int | float) else None), reward_source(best.attributes)
