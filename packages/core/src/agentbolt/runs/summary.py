"""A run's answer to "did it learn?": the summary card of ``agentbolt runs show``, the runs list,
the dashboard's run page and the console summary at the end of a run.

Computed from the store, so it reads the same for every algorithm and backend:

- **held-out figures**, strictest first: the example's own metric (a held-out rollout is correct
  when its final reward reaches the run's threshold; named as the example names it) and the mean
  held-out reward, each at the first and the last evaluation, mean ± standard error over the
  ``n`` held-out rollouts (:func:`~agentbolt.runs.evaluation.mean_and_se`), and at every
  evaluation in between (the chart's standard-error band);
- **trivial policies'** scores on the same metric, when the run recorded them;
- the **training reward**: the mean of the last ``k`` steps' ``train/reward`` (never the last
  step alone: one step of 8 groups is noise);
- **seconds per step**: the mean of ``time/step_s`` over the run;
- the run's training-health **findings** (:mod:`agentbolt.runs.health`).

A run names its metric in its recorded config (``Trainer(run={"config": ...})``)::

    {"heldout_metric": {"name": "accuracy", "threshold": 1.0},
     "trivial": {"most_frequent": 0.052, "first_operand": 0.0}}

Without ``heldout_metric``, an algorithm's ``success_threshold`` setting (torch-grpo records it)
names the metric ``accuracy``; without either, only the held-out reward is shown.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from .. import types as t
from ..store.base import Store
from ..store.run_records import RolloutSearch, Run, RunMetrics
from .findings import Finding

__all__ = [
    "LAST_K",
    "Evaluation",
    "HeldoutFigure",
    "HeldoutMetric",
    "RunSummary",
    "heldout_metric",
    "heldout_score",
    "run_summary",
    "summarize",
]

LAST_K = 5
"""The training reward of the card is the mean of this many last steps."""


@dataclass(frozen=True)
class HeldoutMetric:
    """How a run scores a held-out rollout: correct when its final reward is at least ``threshold``."""

    name: str
    """What the example calls it (``accuracy``, ``exact_match``...)."""
    threshold: float

    def correct(self, rollout: t.Rollout) -> bool | None:
        """Whether ``rollout`` is right, as every held-out figure counts it: :func:`heldout_score`
        at least the threshold (a failed rollout or one without a reward is wrong); ``None`` while
        it has not finished. The card, the comparison page and the trajectory verdict all use this."""
        if not rollout.status.is_final:
            return None
        return heldout_score(rollout) >= self.threshold


def heldout_metric(config: Mapping[str, Any] | None) -> HeldoutMetric | None:
    """The run's own held-out metric, from its recorded config (see the module's docstring)."""
    config = config or {}
    named = config.get("heldout_metric")
    if isinstance(named, Mapping) and isinstance(named.get("threshold"), int | float):
        return HeldoutMetric(str(named.get("name") or "accuracy"), float(named["threshold"]))
    threshold = config.get("success_threshold")
    if isinstance(threshold, int | float) and not isinstance(threshold, bool):
        return HeldoutMetric("accuracy", float(threshold))
    return None


@dataclass(frozen=True)
class Evaluation:
    """One held-out evaluation (a step's ``val`` rollouts) on one metric."""

    step: int
    n: int
    mean: float
    se: float


@dataclass(frozen=True)
class HeldoutFigure:
    """A held-out metric at the first and last evaluation, with every evaluation between."""

    metric: str
    """``accuracy`` (or the example's name for it) or ``reward``."""
    label: str
    """``held-out accuracy``, ``held-out reward``."""
    evaluations: tuple[Evaluation, ...]

    @property
    def first(self) -> Evaluation:
        return self.evaluations[0]

    @property
    def last(self) -> Evaluation:
        return self.evaluations[-1]

    @property
    def gain_in_se(self) -> float | None:
        """``(after - before) / sqrt(se_before^2 + se_after^2)`` (``None`` with one evaluation or no noise)."""
        if len(self.evaluations) < 2:
            return None
        se = math.hypot(self.first.se, self.last.se)
        return (self.last.mean - self.first.mean) / se if se else None

    def text(self) -> str:
        """``held-out accuracy 0.292 ± 0.046 -> 0.531 ± 0.051 (n=96, steps 0 -> 20, +3.5 se)``."""
        f, last = self.first, self.last
        if len(self.evaluations) == 1:
            return f"{self.label} {f.mean:.3f} ± {f.se:.3f} (n={f.n}, step {f.step}; one evaluation)"
        gain = self.gain_in_se
        return (
            f"{self.label} {f.mean:.3f} ± {f.se:.3f} -> {last.mean:.3f} ± {last.se:.3f} "
            f"(n={last.n}, steps {f.step} -> {last.step}" + ("" if gain is None else f", {gain:+.1f} se") + ")"
        )


@dataclass
class RunSummary:
    """The summary card of one run."""

    run: Run
    rollouts: int
    heldout: list[HeldoutFigure] = field(default_factory=list)
    """Strictest first: the run's own metric, then the held-out reward."""
    trivial: dict[str, float] = field(default_factory=dict)
    """Trivial policies' scores on the first held-out figure's metric."""
    train_reward: float | None = None
    """Mean ``train/reward`` of the last :attr:`train_reward_steps` steps."""
    train_reward_steps: int = 0
    s_per_step: float | None = None
    """Mean ``time/step_s`` over :attr:`timed_steps` steps."""
    timed_steps: int = 0
    findings: list[Finding] | None = None
    """Training-health findings (``None``: not computed)."""

    @property
    def headline(self) -> HeldoutFigure | None:
        return self.heldout[0] if self.heldout else None

    @property
    def warnings(self) -> int:
        return sum(f.severity != "info" for f in self.findings or ())

    def lines(self) -> list[str]:
        """The card as plain text lines (the CLI and the console summary)."""
        out = [f.text() for f in self.heldout] or ["held-out: no evaluation recorded"]
        if self.trivial and self.headline is not None:
            best = max(self.trivial.items(), key=lambda kv: kv[1])
            others = ", ".join(f"{k} {v:.3f}" for k, v in sorted(self.trivial.items()) if k != best[0])
            out.append(
                f"trivial policies ({self.headline.metric}): best {best[0]} {best[1]:.3f}"
                + (f"; {others}" if others else "")
            )
        if self.train_reward is not None:
            out.append(f"training reward {self.train_reward:.3f} (mean of the last {self.train_reward_steps} steps)")
        if self.s_per_step is not None:
            out.append(f"{self.s_per_step:.1f} s/step (mean of {self.timed_steps} steps)")
        if self.findings is not None:
            codes = ", ".join(f"{f.code} ({f.severity})" for f in self.findings)
            out.append(f"findings: {len(self.findings)}" + (f": {codes}" if codes else ""))
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: every figure of the card, under the names the card shows."""
        return {
            "run_id": self.run.run_id,
            "rollouts": self.rollouts,
            "heldout": [
                {"metric": h.metric, "label": h.label, "evaluations": [asdict(e) for e in h.evaluations]}
                for h in self.heldout
            ],
            "trivial": self.trivial,
            "train_reward_mean_last": {"k": self.train_reward_steps, "value": self.train_reward},
            "s_per_step_mean": {"steps": self.timed_steps, "value": self.s_per_step},
            "findings": None if self.findings is None else [asdict(f) for f in self.findings],
        }


def _evaluations(rollouts: Sequence[t.Rollout], score: Any) -> tuple[Evaluation, ...]:
    by_step: dict[int, list[float]] = {}
    for r in rollouts:
        if r.step is not None and r.status.is_final:
            by_step.setdefault(r.step, []).append(score(r))
    out = []
    for step in sorted(by_step):
        values = by_step[step]
        mean = statistics.fmean(values)
        out.append(Evaluation(step, len(values), mean, statistics.pstdev(values) / math.sqrt(len(values))))
    return tuple(out)


def heldout_score(r: t.Rollout) -> float:
    """A finished rollout's reward; one that failed or reported none scores 0 (as the algorithms count it)."""
    return r.final_reward if r.status is t.RolloutStatus.SUCCEEDED and r.final_reward is not None else 0.0


def summarize(
    run: Run,
    heldout_rollouts: Sequence[t.Rollout],
    metrics: Sequence[RunMetrics],
    *,
    rollouts: int = 0,
    findings: list[Finding] | None = None,
    last_k: int = LAST_K,
) -> RunSummary:
    """The card from a run's held-out (``val``) rollouts and its recorded metrics."""
    summary = RunSummary(run=run, rollouts=rollouts, findings=findings)
    metric = heldout_metric(run.config)
    val = [r for r in heldout_rollouts if r.mode is t.RolloutMode.VAL]
    figures: list[HeldoutFigure] = []
    if metric is not None:
        rule = metric
        figures.append(
            HeldoutFigure(
                metric.name, f"held-out {metric.name}", _evaluations(val, lambda r: float(rule.correct(r) is True))
            )
        )
    figures.append(HeldoutFigure("reward", "held-out reward", _evaluations(val, heldout_score)))
    summary.heldout = [f for f in figures if f.evaluations]  # an evaluation counts once a rollout of it finished
    trivial = run.config.get("trivial")
    if isinstance(trivial, Mapping):
        summary.trivial = {str(k): float(v) for k, v in trivial.items() if isinstance(v, int | float)}
    per_step: dict[int, dict[str, float]] = {}
    for m in metrics:
        per_step.setdefault(m.step, {}).update(m.values)
    rewards = [v["train/reward"] for _, v in sorted(per_step.items()) if _finite(v.get("train/reward"))]
    if rewards:
        tail = rewards[-last_k:]
        summary.train_reward, summary.train_reward_steps = statistics.fmean(tail), len(tail)
    times = [v["time/step_s"] for v in per_step.values() if _finite(v.get("time/step_s"))]
    if times:
        summary.s_per_step, summary.timed_steps = statistics.fmean(times), len(times)
    return summary


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


async def heldout_rollouts(store: Store, run_id: str) -> list[t.Rollout]:
    """Every held-out (``val``) rollout of the run."""
    out: list[t.Rollout] = []
    offset = 0
    while True:
        page = await store.search_rollouts(
            RolloutSearch(run_id=run_id, mode=t.RolloutMode.VAL, limit=1000, offset=offset)
        )
        out += page.items
        offset += len(page.items)
        if not page.items or offset >= page.total:
            return out


async def run_summary(store: Store, run_id: str, *, findings: bool = True, last_k: int = LAST_K) -> RunSummary:
    """The card of a stored run (``NotFoundError`` for an unknown id); ``findings=False`` skips
    the training-health checks (they read the spans of the first and last steps)."""
    from .health import run_health

    run = await store.get_run(run_id)
    total = (await store.search_rollouts(RolloutSearch(run_id=run_id, limit=1))).total
    found = (await run_health(store, run_id)).findings if findings else None
    return summarize(
        run,
        await heldout_rollouts(store, run_id),
        await store.get_run_metrics(run_id),
        rollouts=total,
        findings=found,
        last_k=last_k,
    )
