"""What a reward may be, checked wherever one enters: feedback, ``emit_reward``, an agent's return
value, stored reward spans, OTLP spans, and LightningRL's inputs.

A reward is **a number**: an ``int`` or ``float`` (numpy scalars included), never a ``bool``, a
string (``"1"``, ``"nan"``, ``"-inf"``), a list or an object. It is **finite**, and its magnitude is
at most :data:`MAX_ABS_REWARD` (``1e15``, fixed): beyond it the group statistics of the advantage
estimators and the float32 arithmetic of the updaters lose every digit or overflow, so such a
value is a bug, not a score. A run (``LightningRLConfig(reward_range=(lo, hi))``) or ``agentbolt
serve`` (its ``lightningrl`` section) can declare the range its rewards live in; a value outside is
refused or clipped (``reward_out_of_range="refuse" | "clip"``).

:class:`RewardBounds` holds those choices; :meth:`RewardBounds.check` returns the value to use or
raises :class:`RewardRefused` with the reason (``not_a_number``, ``non_finite``, ``too_large``,
``out_of_range``) and what to do. Over HTTP a refusal is a 422; in a training step it quarantines
the rollout (:mod:`agentbolt.lightningrl.quarantine`).
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from . import semconv
from .errors import UserError

__all__ = [
    "MAX_ABS_REWARD",
    "OutOfRange",
    "RefusalReason",
    "RewardBounds",
    "RewardDimensionsField",
    "RewardField",
    "RewardRefused",
    "reward_number",
    "reward_span_problem",
]

MAX_ABS_REWARD = 1e15
"""The largest reward magnitude accepted anywhere (fixed): squares of such values stay far from
the float32 and float64 limits, and integers up to it are exact in a float."""

RefusalReason = Literal["not_a_number", "non_finite", "too_large", "out_of_range"]
OutOfRange = Literal["refuse", "clip"]

_PREVIEW = 80


def _preview(value: object) -> str:
    """A short ``repr`` of a refused value (a huge array is not echoed back whole)."""
    try:
        text = repr(value)
    except Exception:  # a hostile __repr__
        text = f"<{type(value).__name__}>"
    return text if len(text) <= _PREVIEW else f"{text[:_PREVIEW]}... ({len(text)} characters)"


class RewardRefused(UserError):
    """A reward value that is not accepted; :attr:`reason` says why (a :data:`RefusalReason`)."""

    def __init__(self, reason: RefusalReason, message: str) -> None:
        super().__init__(message)
        self.reason: RefusalReason = reason


def reward_number(value: object, what: str = "reward") -> float:
    """``value`` as a float if it is a finite number of magnitude at most :data:`MAX_ABS_REWARD`,
    else :class:`RewardRefused` naming ``what`` (no range: see :meth:`RewardBounds.check`)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or type(value).__name__ == "bool_":
        hint = ""
        if isinstance(value, bool) or type(value).__name__ == "bool_":
            hint = f" (use {float(bool(value))} if you mean {float(bool(value))})"
        elif isinstance(value, str):
            hint = " (use the number itself, not a string)"
        raise RewardRefused(
            "not_a_number", f"{what} must be a number, got {type(value).__name__} {_preview(value)}{hint}"
        )
    try:
        number = float(value)
    except (OverflowError, ValueError, TypeError):
        raise RewardRefused("too_large", f"{what} must be at most 1e15 in magnitude, got {_preview(value)}") from None
    if not math.isfinite(number):
        raise RewardRefused("non_finite", f"{what} must be a finite number, got {number}")
    if abs(number) > MAX_ABS_REWARD:
        raise RewardRefused(
            "too_large",
            f"{what} must be at most 1e15 in magnitude, got {number:g}: rescale the rewards",
        )
    return number


def _field_number(value: Any) -> float:
    try:
        return reward_number(value, "the value")
    except RewardRefused as exc:  # pydantic turns a ValueError into a 422 naming the field
        raise ValueError(str(exc)) from None


RewardField = Annotated[float, Field(ge=-MAX_ABS_REWARD, le=MAX_ABS_REWARD), BeforeValidator(_field_number)]
"""A reward in a request body (pydantic): a finite number (no bool, string or container) of
magnitude at most 1e15; anything else is a validation error (a 422 over HTTP)."""
RewardDimensionsField = Annotated[
    dict[Annotated[str, Field(min_length=1, max_length=128)], RewardField], Field(max_length=64)
]
"""Named further scores in a request body: at most 64, each a :data:`RewardField`."""


@dataclass(frozen=True)
class RewardBounds:
    """A run's (or ``agentbolt serve``'s) declared reward range and what to do outside it."""

    reward_range: tuple[float, float] | None = None
    """``(low, high)``, inclusive; ``None``: any number up to :data:`MAX_ABS_REWARD` in magnitude."""
    out_of_range: OutOfRange = "refuse"
    """``refuse`` (422 over HTTP, quarantine in training) or ``clip`` to the nearest bound."""

    def __post_init__(self) -> None:
        if self.reward_range is not None:
            low, high = self.reward_range
            low = reward_number(low, "reward_range low")
            high = reward_number(high, "reward_range high")
            if low > high:
                raise UserError(f"reward_range must be (low, high) with low <= high, got {self.reward_range!r}")
            object.__setattr__(self, "reward_range", (low, high))
        if self.out_of_range not in ("refuse", "clip"):
            raise UserError(f"reward_out_of_range must be 'refuse' or 'clip', got {self.out_of_range!r}")

    def check(self, value: object, what: str = "reward") -> tuple[float, bool]:
        """``(value to use, whether it was clipped)``, or :class:`RewardRefused`."""
        number = reward_number(value, what)
        if self.reward_range is None:
            return number, False
        low, high = self.reward_range
        if low <= number <= high:
            return number, False
        if self.out_of_range == "clip":
            return min(max(number, low), high), True
        raise RewardRefused(
            "out_of_range",
            f"{what} {number:g} is outside the declared reward_range [{low:g}, {high:g}] "
            "(declare a wider range, or reward_out_of_range='clip')",
        )


def reward_span_problem(name: str, attributes: Mapping[str, Any]) -> str | None:
    """Why a span named ``name`` with ``attributes``, if it is a reward span, cannot carry its
    value, or ``None``: for the doors that receive spans (OTLP). The value is
    ``agentbolt.reward.value``, else the primary of its named dimensions (as LightningRL reads
    it). A reward span without a value is left to LightningRL, which counts it as malformed."""
    kind = attributes.get(semconv.SPAN_KIND_ATTR)
    is_reward = kind == semconv.KIND_REWARD if isinstance(kind, str) and kind else name == semconv.SPAN_REWARD
    if not is_reward:
        return None
    if semconv.REWARD_VALUE in attributes:
        value, what = attributes[semconv.REWARD_VALUE], semconv.REWARD_VALUE
    else:
        primary, dims = attributes.get(semconv.REWARD_PRIMARY), attributes.get(semconv.REWARD_DIMENSIONS)
        if isinstance(dims, str):
            try:
                dims = json.loads(dims)
            except ValueError:
                return None  # not dimensions at all: LightningRL counts the span as malformed
        if not (isinstance(primary, str) and isinstance(dims, Mapping) and primary in dims):
            return None
        value, what = dims[primary], f"{semconv.REWARD_DIMENSIONS}[{primary!r}] (the primary)"
    try:
        reward_number(value, f"reward span {name!r}: {what}")
    except RewardRefused as exc:
        return str(exc)
    return None
