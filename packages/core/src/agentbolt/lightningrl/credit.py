"""Credit assignment: an episode's rewards → one reward per LLM call.

Notation used in every docstring here: the episode has calls i = 0 … N-1 in ``seq`` order
(*all* calls, trainable or not: a call of an untrained agent is still a step of the episode),
``r_i`` is the sum of intermediate rewards attached to call i (0 where none, see
:mod:`agentbolt.lightningrl.extraction` for the attachment rules) and ``R`` is the episode return
(the final reward). Assigners return ``None`` when the episode lacks a signal they need (all
built-ins need R); the caller's missing-reward policy then drops or fills the episode.

A credit assigner is a class with ``registry_kind = "credit"``, constructed with keyword
options, whose :meth:`CreditAssigner.assign` maps an :class:`Episode` to a :class:`Credit`.
Plugins register their own through ``agentbolt_register_credit``.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from ..errors import UserError
from .episode import Episode

__all__ = [
    "Credit",
    "CreditAssigner",
    "DiscountedCredit",
    "FinalCredit",
    "IntermediateCredit",
    "discounted_returns",
]


@dataclass(frozen=True)
class Credit:
    """The credit of each call of an episode."""

    rewards: tuple[float, ...]
    """One reward per call of the episode (``len == len(episode.calls)``)."""
    components: tuple[Mapping[str, float], ...] = ()
    """Optional per-call breakdown (e.g. ``{"final": 1.0, "air.tool_error": -1.0}``); empty or
    one mapping per call. Copied into ``Transition.metadata["credit"]``."""
    notes: Mapping[str, int] = field(default_factory=dict)
    """Counters for the batch report (e.g. how many tool errors AIR matched by call id)."""


class CreditAssigner(abc.ABC):
    """Base class of credit assigners (registered with ``registry_kind = "credit"``)."""

    registry_kind: ClassVar[Literal["credit"]] = "credit"
    name: ClassVar[str]
    """Registry name."""

    @abc.abstractmethod
    def assign(self, episode: Episode) -> Credit | None:
        """One reward per call of ``episode``, or ``None`` when a needed reward is missing."""

    def __repr__(self) -> str:
        options = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({options})"


def _check_gamma(gamma: float) -> float:
    if not 0.0 <= gamma <= 1.0:
        raise UserError(f"gamma must be in [0, 1], got {gamma!r}")
    return float(gamma)


def discounted_returns(step_rewards: tuple[float, ...] | list[float], final: float, gamma: float) -> list[float]:
    """Return-to-go G_i = Σ_{k=i}^{N-1} gamma^{k-i} r_k + gamma^{N-1-i} R (R received at the last call).

    Computed backwards: G_{N-1} = r_{N-1} + R, G_i = r_i + gamma G_{i+1}.
    """
    out = [0.0] * len(step_rewards)
    running = final
    for i in range(len(step_rewards) - 1, -1, -1):
        running = step_rewards[i] + (running if i == len(step_rewards) - 1 else gamma * running)
        out[i] = running
    return out


class FinalCredit(CreditAssigner):
    """Every call gets the episode return (the paper's default): ``c_i = R``.

    Intermediate rewards are ignored.
    """

    name = "final"

    def assign(self, episode: Episode) -> Credit | None:
        if episode.final_reward is None:
            return None
        return Credit(rewards=(episode.final_reward,) * len(episode.calls))


class DiscountedCredit(CreditAssigner):
    """Return-to-go over calls with discount gamma:
    ``c_i = Σ_{k=i}^{N-1} gamma^{k-i} r_k + gamma^{N-1-i} R``.

    R is received at the last call; with ``include_intermediate=False`` the ``r_k`` are dropped
    (``c_i = gamma^{N-1-i} R``). gamma = 1 gives the undiscounted return-to-go; gamma = 0 gives each call
    only its own reward (plus R on the last call).

    Args:
        gamma: discount per call, in [0, 1].
        include_intermediate: add the intermediate rewards.
    """

    name = "discounted"

    def __init__(self, *, gamma: float = 0.95, include_intermediate: bool = True) -> None:
        self.gamma = _check_gamma(gamma)
        self.include_intermediate = include_intermediate

    def assign(self, episode: Episode) -> Credit | None:
        if episode.final_reward is None:
            return None
        steps = episode.step_rewards if self.include_intermediate else (0.0,) * len(episode.calls)
        return Credit(rewards=tuple(discounted_returns(steps, episode.final_reward, self.gamma)))


class IntermediateCredit(CreditAssigner):
    """Per-call rewards plus the final reward: ``c_i = w_R · R + w_r · r_i``.

    Every call shares the episode outcome and keeps its own intermediate reward (from
    ``emit_reward``, possibly with an explicit target).

    Args:
        final_weight: w_R.
        intermediate_weight: w_r.
    """

    name = "intermediate"

    def __init__(self, *, final_weight: float = 1.0, intermediate_weight: float = 1.0) -> None:
        self.final_weight = float(final_weight)
        self.intermediate_weight = float(intermediate_weight)

    def assign(self, episode: Episode) -> Credit | None:
        if episode.final_reward is None:
            return None
        base = self.final_weight * episode.final_reward
        steps = episode.step_rewards
        return Credit(
            rewards=tuple(base + self.intermediate_weight * r for r in steps),
            components=tuple({"final": base, "intermediate": self.intermediate_weight * r} for r in steps),
        )
