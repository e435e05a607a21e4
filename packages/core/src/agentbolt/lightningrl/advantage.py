"""Advantage estimators: credit-assigned transitions → advantages across the rollouts of a group.

Notation: a batch holds transitions t with reward x_t (their assigned credit). Rollouts j in
group g (``Transition.group_id``; a rollout without one forms its own group, reported as
``ungrouped_rollouts``) have n_j transitions in the batch.

**Level ``"rollout"``** (default, LightningRL): every rollout counts once in the group
statistics, whatever its number of calls. Each transition of rollout j has weight 1/n_j, so
the group mean is mu_g = (1/J) Σ_j s_j with s_j = mean_i x_{j,i}, and the group standard
deviation is sigma_g = sqrt(Σ_t w_t (x_t - mu_g)² / (J - 1)) (Bessel-corrected over J rollouts).
When credit is the same for every call of a rollout (``final``), s_j = R_j, sigma_g is the usual
sample std of the rollout returns and each rollout gets exactly one advantage, broadcast to
its transitions. With per-call credit (``discounted``, ``intermediate``, ``air``) the
transitions keep their distinct credit; only the statistics are per rollout.

**Level ``"transition"``** (v0 comparison): every transition is one sample (weight 1) in its
group; rollouts with more calls weigh more.

Arithmetic never overflows: when the largest magnitude in a group (or batch) exceeds
:data:`SAFE_MAGNITUDE` (``1e150``, where squares would overflow float64), the values are divided by
it before the mean, the squares and the std are taken (``math.fsum`` throughout), and GRPO's and the
whitening's quotients are formed in that scale (they are scale-free). Below it nothing is scaled and
the results are bit for bit the plain formulas. A group whose advantages still cannot be
represented (RLOO's or REINFORCE++'s ``x - b`` beyond the float range, e.g. ``1e308`` and
``-1e308`` in one group) is left out whole and reported in :attr:`AdvantageResult.quarantined`
(``advantage_overflow``); the other groups keep their advantages. (LightningRL refuses rewards
beyond ``1e15`` in magnitude before they get here: see :mod:`agentbolt.reward_validation`.)

Edge cases: a group whose values are all equal (including a group of one) gets advantage
exactly 0, never NaN; a group of one has no standard deviation, so no scaling is applied.
Transitions with ``reward=None`` follow the ``missing`` policy: ``"drop"`` (default; removed and
reported in :attr:`AdvantageResult.dropped`), ``"fill"`` (``fill_value`` is required: there is
no silent 0) or ``"error"``.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from ..errors import SchemaError, UserError
from ..types import Transition

__all__ = [
    "GRPO",
    "RLOO",
    "SAFE_MAGNITUDE",
    "AdvantageEstimator",
    "AdvantageResult",
    "ReinforcePlusPlus",
]

SAFE_MAGNITUDE = 1e150
"""Largest magnitude used unscaled: its square (1e300) and sums of many such squares stay finite."""

Level = Literal["rollout", "transition"]
MissingPolicy = Literal["drop", "fill", "error"]


@dataclass(frozen=True)
class AdvantageResult:
    """What an estimator returns."""

    transitions: list[Transition]
    """The input transitions (same order) with ``advantage`` set, minus dropped ones."""
    dropped: list[Transition] = field(default_factory=list)
    """Transitions removed because their reward was missing (``missing="drop"``)."""
    quarantined: dict[str, str] = field(default_factory=dict)
    """Rollout id -> why its transitions were left out: their group's advantages are not finite
    (``advantage_overflow``)."""
    stats: dict[str, float | int | str] = field(default_factory=dict)
    """Counters for logging: ``groups``, ``singleton_groups`` (one rollout), ``zero_variance_groups``
    (several rollouts, all rewards equal: no learning signal),
    ``ungrouped_rollouts``, ``dropped_missing_reward``, ``filled_missing_reward``, advantage
    mean/min/max, ``level``."""


class AdvantageEstimator(abc.ABC):
    """Base class of advantage estimators (registered with ``registry_kind = "advantage"``)."""

    registry_kind: ClassVar[Literal["advantage"]] = "advantage"
    name: ClassVar[str]
    """Registry name."""

    @abc.abstractmethod
    def estimate(self, transitions: Sequence[Transition]) -> AdvantageResult:
        """Advantages of ``transitions`` (rewards already assigned)."""

    def __repr__(self) -> str:
        options = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({options})"


@dataclass
class _Group:
    """The transitions of one group: positions in the batch, values, weights, unit of each."""

    members: list[int] = field(default_factory=list)
    units: dict[str, list[int]] = field(default_factory=dict)
    rollouts: set[str] = field(default_factory=set)


def _all_equal(values: Sequence[float]) -> bool:
    first = values[0]
    return all(v == first for v in values)


def _mean(values: Sequence[float]) -> float:
    """Arithmetic mean; exactly the common value when all values are equal."""
    return values[0] if _all_equal(values) else math.fsum(values) / len(values)


def _scale(std: float | None, epsilon: float) -> float:
    """Divisor sigma + eps; 1 when sigma is undefined (one unit) or sigma + eps is 0."""
    if std is None or std + epsilon == 0.0:
        return 1.0
    return std + epsilon


def _magnitude(values: Sequence[float]) -> float:
    """The divisor that keeps arithmetic on ``values`` finite: 1 up to :data:`SAFE_MAGNITUDE`,
    else the largest magnitude."""
    top = max((abs(v) for v in values), default=0.0)
    return top if top > SAFE_MAGNITUDE else 1.0


def _weighted_stats(
    values: Sequence[float], weights: Sequence[float], n_units: int, scale: float = 1.0
) -> tuple[float, float | None]:
    """(mean, Bessel-corrected std over ``n_units``) of weighted ``values / scale``; std is
    ``None`` for one unit. All-equal values give their (scaled) value exactly and std 0."""
    if _all_equal(values):
        return values[0] / scale, (0.0 if n_units > 1 else None)
    scaled = values if scale == 1.0 else [v / scale for v in values]
    mean = math.fsum(w * v for v, w in zip(scaled, weights, strict=True)) / n_units
    if n_units <= 1:
        return mean, None
    var = math.fsum(w * (v - mean) ** 2 for v, w in zip(scaled, weights, strict=True)) / (n_units - 1)
    return mean, math.sqrt(var)


def _normalized(
    values: Sequence[float], weights: Sequence[float], n_units: int, epsilon: float, norm_std: bool
) -> list[float]:
    """``(v - mean) / (std + eps)`` (or ``v - mean`` without ``norm_std`` or std) of each value,
    formed in the scale of :func:`_magnitude` so that no intermediate overflows."""
    m = _magnitude(values)
    mean, std = _weighted_stats(values, weights, n_units, m)
    if m == 1.0:
        scale = _scale(std, epsilon) if norm_std else 1.0
        return [(v - mean) / scale for v in values]
    centered = [v / m - mean for v in values]
    if not norm_std or std is None or std + epsilon == 0.0:
        return [c * m for c in centered]  # may overflow: the caller checks
    return [c / (std + epsilon / m) for c in centered]


class _GroupEstimator(AdvantageEstimator):
    """Shared machinery: missing rewards, grouping, units and weights, result assembly."""

    def __init__(
        self,
        *,
        level: Level = "rollout",
        missing: MissingPolicy = "drop",
        fill_value: float | None = None,
        epsilon: float = 1e-6,
    ) -> None:
        if level not in ("rollout", "transition"):
            raise UserError(f"level must be 'rollout' or 'transition', got {level!r}")
        if missing not in ("drop", "fill", "error"):
            raise UserError(f"missing must be 'drop', 'fill' or 'error', got {missing!r}")
        if missing == "fill" and fill_value is None:
            raise UserError("missing='fill' needs an explicit fill_value (missing rewards are never silently 0)")
        if epsilon < 0:
            raise UserError(f"epsilon must be >= 0, got {epsilon!r}")
        self.level: Level = level
        self.missing: MissingPolicy = missing
        self.fill_value = None if fill_value is None else float(fill_value)
        self.epsilon = float(epsilon)

    # -- subclass hook ---------------------------------------------------------------------------

    @abc.abstractmethod
    def _centered(
        self, x: list[float], w: list[float], group: _Group, stats: dict[str, float | int | str]
    ) -> dict[int, float]:
        """Advantage (before any batch-level step) of each member of ``group``."""

    def _batch(self, adv: list[float], w: list[float], n_units: int) -> list[float]:
        """Batch-level step after the group step (identity by default)."""
        return adv

    # -- driver ----------------------------------------------------------------------------------

    def estimate(self, transitions: Sequence[Transition]) -> AdvantageResult:
        kept: list[Transition] = []
        x: list[float] = []
        dropped: list[Transition] = []
        filled = 0
        for t in transitions:
            reward = t.reward
            if reward is None:
                if self.missing == "drop":
                    dropped.append(t)
                    continue
                if self.missing == "error":
                    raise SchemaError(
                        f"transition {t.index} of rollout {t.rollout_id!r} has no reward "
                        "(set missing='drop' or missing='fill' with a fill_value)"
                    )
                assert self.fill_value is not None
                reward = self.fill_value
                t = t.model_copy(update={"reward": reward})
                filled += 1
            elif not math.isfinite(reward):
                raise SchemaError(f"transition {t.index} of rollout {t.rollout_id!r} has non-finite reward {reward!r}")
            kept.append(t)
            x.append(float(reward))

        groups: dict[str, _Group] = {}
        group_of_rollout: dict[str, str | None] = {}
        n_per_rollout: dict[str, int] = {}
        for i, t in enumerate(kept):
            previous = group_of_rollout.setdefault(t.rollout_id, t.group_id)
            if previous != t.group_id:
                raise SchemaError(f"rollout {t.rollout_id!r} has transitions in groups {previous!r} and {t.group_id!r}")
            n_per_rollout[t.rollout_id] = n_per_rollout.get(t.rollout_id, 0) + 1
            key = t.group_id if t.group_id is not None else f"\x00rollout:{t.rollout_id}"
            group = groups.setdefault(key, _Group())
            group.members.append(i)
            group.rollouts.add(t.rollout_id)
            unit = t.rollout_id if self.level == "rollout" else str(i)
            group.units.setdefault(unit, []).append(i)
        w = [1.0 / n_per_rollout[t.rollout_id] for t in kept] if self.level == "rollout" else [1.0] * len(kept)

        stats: dict[str, float | int | str] = {
            "level": self.level,
            "transitions": len(kept),
            "rollouts": len(n_per_rollout),
            "groups": len(groups),
            "singleton_groups": 0,
            "zero_variance_groups": 0,
            "ungrouped_rollouts": sum(1 for g in group_of_rollout.values() if g is None),
            "dropped_missing_reward": len(dropped),
            "filled_missing_reward": filled,
        }
        adv = [0.0] * len(kept)
        quarantined: dict[str, str] = {}
        for key, group in groups.items():
            if len(group.rollouts) == 1:
                stats["singleton_groups"] = int(stats["singleton_groups"]) + 1
            elif _all_equal([x[i] for i in group.members]):
                stats["zero_variance_groups"] = int(stats["zero_variance_groups"]) + 1
            centered = self._centered(x, w, group, stats)
            if not all(math.isfinite(a) for a in centered.values()):
                name = "its own group" if key.startswith("\x00") else f"group {key!r}"
                top = max(abs(x[i]) for i in group.members)
                for rollout_id in group.rollouts:
                    quarantined[rollout_id] = (
                        f"advantage_overflow: the advantages of {name} (rewards up to {top:g} in magnitude) "
                        "exceed the float range"
                    )
                continue
            for i, a in centered.items():
                adv[i] = a
        if quarantined:
            keep = [i for i, t in enumerate(kept) if t.rollout_id not in quarantined]
            kept, x, w, adv = (
                [kept[i] for i in keep],
                [x[i] for i in keep],
                [w[i] for i in keep],
                [adv[i] for i in keep],
            )
            stats["quarantined_rollouts"] = len(quarantined)
        n_units = len({t.rollout_id for t in kept}) if self.level == "rollout" else len(kept)
        adv = self._batch(adv, w, n_units)
        out = [t.model_copy(update={"advantage": a}) for t, a in zip(kept, adv, strict=True)]
        if adv:
            m = _magnitude(adv)
            mean = math.fsum(a / m for a in adv) / len(adv) * m
            stats.update(advantage_mean=mean, advantage_min=min(adv), advantage_max=max(adv))
        return AdvantageResult(transitions=out, dropped=dropped, stats=stats, quarantined=quarantined)


class GRPO(_GroupEstimator):
    """Group-relative advantage: ``A_t = (x_t - mu_g) / (sigma_g + eps)``, or ``x_t - mu_g`` with
    ``norm_std=False`` or in a group of one (mu_g, sigma_g as in the module docstring).

    Args:
        level: ``"rollout"`` (each rollout counts once) or ``"transition"`` (v0 grouping).
        norm_std: divide by the group standard deviation (Dr. GRPO turns this off).
        missing, fill_value: missing-reward policy.
        epsilon: eps.
    """

    name = "grpo"

    def __init__(
        self,
        *,
        level: Level = "rollout",
        norm_std: bool = True,
        missing: MissingPolicy = "drop",
        fill_value: float | None = None,
        epsilon: float = 1e-6,
    ) -> None:
        super().__init__(level=level, missing=missing, fill_value=fill_value, epsilon=epsilon)
        self.norm_std = norm_std

    def _centered(
        self, x: list[float], w: list[float], group: _Group, stats: dict[str, float | int | str]
    ) -> dict[int, float]:
        values = [x[i] for i in group.members]
        adv = _normalized(values, [w[i] for i in group.members], len(group.units), self.epsilon, self.norm_std)
        return dict(zip(group.members, adv, strict=True))


class RLOO(_GroupEstimator):
    """REINFORCE leave-one-out: ``A_t = x_t - b_u``, with b_u the mean of the *other* units of
    the group: ``b_j = (Σ_{k≠j} s_k) / (J - 1)`` (units are rollouts at rollout level,
    transitions at transition level). In a group of one ``b_j = s_j`` (no baseline exists; the
    advantage is 0 under constant credit). No std normalization.

    Args:
        level: ``"rollout"`` or ``"transition"``.
        missing, fill_value: missing-reward policy.
    """

    name = "rloo"

    def __init__(
        self, *, level: Level = "rollout", missing: MissingPolicy = "drop", fill_value: float | None = None
    ) -> None:
        super().__init__(level=level, missing=missing, fill_value=fill_value)

    def _centered(
        self, x: list[float], w: list[float], group: _Group, stats: dict[str, float | int | str]
    ) -> dict[int, float]:
        m = _magnitude([x[i] for i in group.members])
        means = {u: _mean([x[i] / m for i in members]) for u, members in group.units.items()}
        scores = list(means.values())
        equal = _all_equal(scores)
        total = math.fsum(scores)
        n = len(scores)
        out: dict[int, float] = {}
        for unit, members in group.units.items():
            baseline = means[unit] if n == 1 or equal else (total - means[unit]) / (n - 1)
            for i in members:
                out[i] = x[i] - baseline if m == 1.0 else (x[i] / m - baseline) * m  # may overflow: checked
        return out


class ReinforcePlusPlus(_GroupEstimator):
    """REINFORCE++ with baseline: subtract the group mean, then whiten across the batch.

    ``d_t = x_t - mu_g``; ``A_t = (d_t - m) / (sigma_b + eps)`` where m and sigma_b are the weighted mean
    and Bessel-corrected std of the d_t over the whole batch (each rollout counts once at
    rollout level, each transition at transition level). With one unit in the batch, or
    ``whiten=False``, ``A_t = d_t - m`` / ``A_t = d_t``.

    Args:
        level: ``"rollout"`` or ``"transition"``.
        whiten: apply the batch normalization.
        missing, fill_value: missing-reward policy.
        epsilon: eps.
    """

    name = "reinforce_pp"

    def __init__(
        self,
        *,
        level: Level = "rollout",
        whiten: bool = True,
        missing: MissingPolicy = "drop",
        fill_value: float | None = None,
        epsilon: float = 1e-6,
    ) -> None:
        super().__init__(level=level, missing=missing, fill_value=fill_value, epsilon=epsilon)
        self.whiten = whiten

    def _centered(
        self, x: list[float], w: list[float], group: _Group, stats: dict[str, float | int | str]
    ) -> dict[int, float]:
        values = [x[i] for i in group.members]
        adv = _normalized(values, [w[i] for i in group.members], len(group.units), self.epsilon, norm_std=False)
        return dict(zip(group.members, adv, strict=True))

    def _batch(self, adv: list[float], w: list[float], n_units: int) -> list[float]:
        if not self.whiten or not adv:
            return adv
        return _normalized(adv, w, n_units, self.epsilon, norm_std=True)
