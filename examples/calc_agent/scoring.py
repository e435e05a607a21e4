"""The calculator agent's score: the number in the last ``<answer>...</answer>`` against the gold result.

One function scores training (the reward), the held-out accuracy (reward 1.0 = correct) and the
trivial policies of :mod:`baselines`.
"""

from __future__ import annotations

from data import parse_number

CORRECT = 1.0
"""The reward of a right answer; held-out accuracy is the share of rollouts with this reward."""
WELL_FORMED = 0.1
"""The reward of a wrong number in ``<answer>`` tags."""


def final_answer(text: str) -> float | None:
    """The number inside the last ``<answer>...</answer>`` of a reply, or None."""
    start = text.rfind("<answer>")
    end = text.find("</answer>", start)
    if start < 0 or end < 0:
        return None
    return parse_number(text[start + len("<answer>") : end])


def reward(text: str, gold: float) -> float:
    """1.0 for the right number in ``<answer>`` tags (relative tolerance 1e-4), 0.1 for a wrong one, else 0."""
    value = final_answer(text)
    if value is None:
        return 0.0
    return CORRECT if abs(value - gold) <= 1e-6 + 1e-4 * abs(gold) else WELL_FORMED
