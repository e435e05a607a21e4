"""The held-out gate: a candidate goes live only if it does not score worse than the live version
by more than the evaluation's noise.

Both versions run the same held-out tasks through the agent (``samples`` rollouts each). Per
task the gate takes the candidate's mean reward minus the live version's, ``d_i``; over the n
tasks it takes the mean ``d`` and its standard error ``se = sd(d_i) / sqrt(n)`` (paired: the
tasks' own difficulty cancels). The candidate passes when

    d  >=  -(z * se + tolerance)

i.e. it may be worse only by what ``z`` standard errors of noise (default 2, about a 2.5%
one-sided false-rejection rate for a candidate exactly as good) plus ``tolerance`` allow. An
evaluation where more than ``max_failed`` of the rollouts failed or gave no reward is a
rejection too: the gate cannot tell. Held-out tasks never reach training: sessions whose question
(the last user message of their first call, case and whitespace ignored) or task key is a
held-out task's text are left out of every update (counted as ``online/held_out_overlap``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from .. import types as t

__all__ = ["GateDecision", "GateScore", "decide", "score_of"]


@dataclass(frozen=True)
class GateScore:
    """One version's held-out evaluation."""

    version: int
    mean: float
    """Mean reward over all evaluation rollouts (failed or unrewarded ones count 0)."""
    per_task: dict[str, float]
    """Task id -> mean reward of its samples."""
    rollouts: int
    failed: int
    """Rollouts that failed or gave no reward."""

    @property
    def se(self) -> float:
        """Standard error of the mean over tasks (0 with fewer than 2 tasks)."""
        values = list(self.per_task.values())
        return statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "se": self.se}


@dataclass(frozen=True)
class GateDecision:
    """Whether a candidate went live, and why."""

    version: int
    passed: bool
    reason: str
    candidate: GateScore | None = None
    live: GateScore | None = None
    delta: float | None = None
    """Mean paired difference candidate - live."""
    delta_se: float | None = None
    bound: float | None = None
    """The lowest ``delta`` that passes."""
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k not in ("candidate", "live")}
        out["candidate"] = self.candidate.as_dict() if self.candidate else None
        out["live"] = self.live.as_dict() if self.live else None
        return out

    def metrics(self) -> dict[str, float]:
        """Finite numbers for the run's metrics (``gate/*``)."""
        values = {"gate/version": float(self.version), "gate/passed": 1.0 if self.passed else 0.0}
        if self.candidate is not None:
            values |= {"gate/candidate_mean": self.candidate.mean, "gate/candidate_se": self.candidate.se}
        if self.live is not None:
            values |= {"gate/live_mean": self.live.mean, "gate/live_se": self.live.se}
        for name in ("delta", "delta_se", "bound"):
            value = getattr(self, name)
            if value is not None and math.isfinite(value):
                values[f"gate/{name}"] = value
        return values


def score_of(version: int, rollouts: Sequence[t.Rollout]) -> GateScore:
    """The evaluation score of ``version`` from its finished evaluation rollouts."""
    by_task: dict[str, list[float]] = {}
    failed = 0
    for r in rollouts:
        ok = r.status is t.RolloutStatus.SUCCEEDED and r.final_reward is not None and math.isfinite(r.final_reward)
        failed += not ok
        by_task.setdefault(r.task_id or r.rollout_id, []).append(float(r.final_reward) if ok else 0.0)  # type: ignore[arg-type]
    per_task = {k: statistics.fmean(v) for k, v in by_task.items()}
    values = [x for v in by_task.values() for x in v]
    return GateScore(version, statistics.fmean(values) if values else 0.0, per_task, len(rollouts), failed)


def decide(
    candidate: GateScore,
    live: GateScore,
    *,
    z: float = 2.0,
    tolerance: float = 0.0,
    max_failed: float = 0.5,
) -> GateDecision:
    """The gate's decision (see the module docstring)."""
    v = candidate.version
    if candidate.rollouts == 0:
        return GateDecision(v, False, "the candidate's evaluation ran no rollout", candidate, live)
    if candidate.failed > max_failed * candidate.rollouts:
        return GateDecision(
            v,
            False,
            f"{candidate.failed} of {candidate.rollouts} evaluation rollouts failed or gave no reward "
            f"(more than {max_failed:.0%}): the gate cannot tell",
            candidate,
            live,
        )
    common = sorted(set(candidate.per_task) & set(live.per_task))
    if not common:
        return GateDecision(v, False, "the candidate and the live version share no evaluated task", candidate, live)
    diffs = [candidate.per_task[k] - live.per_task[k] for k in common]
    delta = statistics.fmean(diffs)
    se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else 0.0
    bound = -(z * se + tolerance)
    passed = delta >= bound - 1e-12
    verdict = "within" if passed else "below"
    reason = (
        f"held-out reward {candidate.mean:.3f} vs live {live.mean:.3f} over {len(common)} tasks: "
        f"difference {delta:+.3f} (se {se:.3f}) is {verdict} the noise bound {bound:+.3f} (z={z:g}, tolerance {tolerance:g})"
    )
    return GateDecision(v, passed, reason, candidate, live, delta, se, bound)


def score_from_record(record: Mapping[str, Any]) -> GateScore:
    """A :class:`GateScore` from its ``as_dict`` form (the ledger)."""
    return GateScore(
        int(record["version"]),
        float(record["mean"]),
        {str(k): float(v) for k, v in record["per_task"].items()},
        int(record["rollouts"]),
        int(record["failed"]),
    )
