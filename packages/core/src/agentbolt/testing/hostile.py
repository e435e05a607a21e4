"""Hostile reward values: what a broken judge, client or agent may send, for tests of the doors
rewards enter by and of the quarantine behind them (:mod:`agentbolt.reward_validation`).

``HOSTILE_REWARDS`` holds each kind once: overflowing floats, infinities and NaN (as floats and as
text), numeric strings, bools, nested objects, huge arrays and integers beyond the float range.
Hypothesis users draw from it with ``st.sampled_from(HOSTILE_REWARDS)`` and add generated ones
(:func:`is_hostile` says whether a generated value must be refused).
"""

from __future__ import annotations

import math
from typing import Any

from ..reward_validation import RewardRefused, reward_number

__all__ = ["HOSTILE_REWARDS", "STORABLE_HOSTILE_REWARDS", "is_hostile"]

STORABLE_HOSTILE_REWARDS: tuple[Any, ...] = (
    1e200,
    1e308,
    -1e308,
    1e16,
    2**62,
    "-inf",
    "inf",
    "nan",
    "NaN",
    "1",
    "1e308",
    "",
    True,
    False,
    [1.0, 2.0],
    [0.5] * 100_000,
    ["1"],
)
"""Hostile values an OpenTelemetry attribute (hence a stored span) can hold."""

HOSTILE_REWARDS: tuple[Any, ...] = (
    *STORABLE_HOSTILE_REWARDS,
    math.inf,
    -math.inf,
    math.nan,
    10**400,
    {"reward": 1.0},
    {"nested": {"deeper": [1, 2, {"x": None}]}},
    None,
    [],
    b"1",
)
"""Every hostile kind, including what only a foreign writer or a JSON body could carry."""


def is_hostile(value: object) -> bool:
    """Whether ``value`` must be refused as a reward (not a finite number within ``1e15``)."""
    try:
        reward_number(value)
    except RewardRefused:
        return True
    return False
