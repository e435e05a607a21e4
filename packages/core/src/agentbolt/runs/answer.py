"""What a rollout was asked, what the agent replied, what was expected, and whether it was right.

The first thing a reader of a trajectory wants (``agentbolt rollouts show``, the dashboard's
trajectory page), read from what the store holds:

- the **question**: the task input's ``question`` (or ``prompt``, ``query``, ``problem``,
  ``instruction``, ``input``), else the last user message of the first LLM call;
- the **reply**: the text of the last LLM call's answer (the reply the reward judged);
- the **expected answer**: the task input's ``answer`` (or ``expected``, ``target``, ``gold``,
  ``label``, ``solution``, ``ground_truth``), when the task carries one;
- the **verdict**: :meth:`HeldoutMetric.correct <agentbolt.runs.summary.HeldoutMetric.correct>`
  of the run's held-out metric (:func:`agentbolt.runs.summary.heldout_metric`, e.g. ``accuracy``
  at 1.0), the rule the summary card and the comparison page count by (a failed rollout is wrong),
  with the reward's named dimensions (its parts) when the agent emitted them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import semconv
from .. import types as t
from .summary import HeldoutMetric

__all__ = ["ANSWER_KEYS", "QUESTION_KEYS", "RolloutAnswer", "rollout_answer", "task_question"]

QUESTION_KEYS = ("question", "prompt", "query", "problem", "instruction", "input")
"""Task input fields read as the question, first found wins."""
ANSWER_KEYS = ("answer", "expected", "expected_answer", "target", "gold", "label", "solution", "ground_truth")
"""Task input fields read as the expected answer, first found wins."""


@dataclass(frozen=True)
class RolloutAnswer:
    """The first screen of a trajectory."""

    question: str | None
    reply: str | None
    expected: str | None
    reward: float | None
    metric: HeldoutMetric | None
    """The run's held-out metric (its threshold decides the verdict); ``None``: no verdict."""
    parts: Mapping[str, float] = field(default_factory=dict)
    """The final reward's named dimensions."""
    correct: bool | None = None
    """:meth:`HeldoutMetric.correct <agentbolt.runs.summary.HeldoutMetric.correct>` of the rollout
    (``None`` without a threshold or while the rollout runs)."""

    @property
    def verdict(self) -> str:
        """``✓ correct``, ``✗ wrong`` or ``no verdict`` (no threshold, or the rollout still runs)."""
        if self.correct is None:
            return "no verdict"
        name = self.metric.name if self.metric is not None else "correct"
        return f"✓ correct ({name})" if self.correct else f"✗ wrong ({name})"

    def parts_text(self) -> str:
        """``reward 0.1 (correct 0, parity 1); correct at >= 1`` — the reward and what it is made of."""
        if self.reward is None:
            return "no reward"
        text = f"reward {self.reward:g}"
        parts = {k: v for k, v in self.parts.items() if not (k == "reward" and v == self.reward)}  # not the total again
        if parts:
            text += " (" + ", ".join(f"{k} {v:g}" for k, v in parts.items()) + ")"
        if self.metric is not None:
            text += f"; {self.metric.name} needs >= {self.metric.threshold:g}"
        return text


def _field(value: Any, keys: Sequence[str]) -> str | None:
    if isinstance(value, Mapping):
        for key in keys:
            found = value.get(key)
            if found is not None and not isinstance(found, Mapping | list):
                return str(found)
        return None
    return None


def task_question(rollout: t.Rollout) -> str | None:
    """The question the task input carries (a :data:`QUESTION_KEYS` field, or the input itself
    when it is text); ``None`` without one."""
    question = _field(rollout.input, QUESTION_KEYS)
    if question is None and isinstance(rollout.input, str):
        question = rollout.input
    return question


def _text(message: Mapping[str, Any]) -> str:
    return str(message.get("text") or "")


def _dimensions(spans: Sequence[t.Span]) -> dict[str, float]:
    """The reward's parts: the named dimensions of the last reward span that has parts besides
    the total (an agent's ``emit_reward({...})``; the reward it returns is recorded as its total alone)."""
    found: list[dict[str, float]] = []
    for span in spans:
        if span.name != semconv.SPAN_REWARD or semconv.REWARD_DIMENSIONS not in span.attributes:
            continue
        raw = span.attributes[semconv.REWARD_DIMENSIONS]
        try:
            values = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError:
            continue
        if isinstance(values, Mapping):
            found.append(
                {str(k): float(v) for k, v in values.items() if isinstance(v, int | float) and not isinstance(v, bool)}
            )
    rich = [d for d in found if len(d) > 1]
    return (rich or found or [{}])[-1]


def rollout_answer(
    rollout: t.Rollout,
    calls: Sequence[Any],
    spans: Sequence[t.Span],
    metric: HeldoutMetric | None,
    reward: float | None = None,
) -> RolloutAnswer:
    """The answer of ``rollout`` from its LLM calls (:class:`~agentbolt.runs.views.CallView`, in
    order), its spans (for the reward's dimensions) and the run's metric."""
    question = task_question(rollout)
    if question is None and calls:
        users = [m for m in calls[0].input_messages if m.get("role") == "user"]
        question = _text(users[-1]) if users else None
    reply = None
    for call in reversed(calls):
        texts = [_text(m) for m in call.output_messages if _text(m)]
        if texts:
            reply = texts[-1]
            break
    return RolloutAnswer(
        question=question,
        reply=reply,
        expected=_field(rollout.input, ANSWER_KEYS),
        reward=reward if reward is not None else rollout.final_reward,
        metric=metric,
        parts=_dimensions(spans),
        correct=None if metric is None else metric.correct(rollout),
    )
