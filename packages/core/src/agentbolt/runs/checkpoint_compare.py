"""Two evaluations (checkpoints) of a run side by side, on the same held-out questions.

"Which questions did training fix, and which did it break?" — the dashboard's comparison page
(``/runs/<id>/compare?a=<step>&b=<step>``) reads its rows from :func:`compare_checkpoints`:
one row per held-out question, with the question, the expected answer, and at each of the two
evaluations the reply, the reward and the verdict. Each row is one **change**:

- ``improved`` — wrong at A, right at B;
- ``regressed`` — right at A, wrong at B;
- ``both-right`` and ``both-wrong``;
- ``unpaired`` — the question was evaluated at only one of the two steps (an evaluation cut short).

A rollout is right when it scores at least the run's threshold, scored exactly as the summary
card scores it (:mod:`agentbolt.runs.summary`: a failed rollout or one without a reward scores
0), so the counts agree with the card's held-out accuracy at both steps::

    accuracy(A) * n(A) == both-right + regressed + unpaired right at A
    accuracy(B) * n(B) == both-right + improved + unpaired right at B

Questions are matched by task id; when an evaluation sampled a question several times, the k-th
sample at A (in enqueue order) is paired with the k-th at B.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from .. import types as t
from ..errors import UserError
from ..store.base import Store
from ..store.run_records import Run
from .answer import RolloutAnswer, rollout_answer
from .summary import HeldoutMetric, heldout_metric, heldout_rollouts, heldout_score
from .views import llm_calls

__all__ = [
    "CHANGES",
    "Change",
    "CheckpointComparison",
    "ComparedQuestion",
    "Sample",
    "compare_checkpoints",
    "counts_json",
    "parse_change",
]

Change = Literal["improved", "regressed", "both-right", "both-wrong", "unpaired"]
CHANGES: tuple[Change, ...] = ("improved", "regressed", "both-right", "both-wrong", "unpaired")
"""Every change, in the order the page lists them (also the values of its ``filter`` parameter)."""


@dataclass(frozen=True)
class Sample:
    """One held-out rollout of a question at one evaluation."""

    rollout_id: str
    reply: str | None
    score: float
    """The reward the held-out figures count: the final reward, 0 for a failed rollout or none."""
    correct: bool
    """:meth:`HeldoutMetric.correct <agentbolt.runs.summary.HeldoutMetric.correct>`: ``score >= threshold``."""
    status: t.RolloutStatus


@dataclass(frozen=True)
class ComparedQuestion:
    """A held-out question at evaluation A and at evaluation B (``None`` where not evaluated)."""

    task_id: str
    question: str | None
    expected: str | None
    a: Sample | None
    b: Sample | None

    @property
    def change(self) -> Change:
        """What happened to the question between A and B."""
        if self.a is None or self.b is None:
            return "unpaired"
        if self.a.correct == self.b.correct:
            return "both-right" if self.a.correct else "both-wrong"
        return "improved" if self.b.correct else "regressed"


@dataclass(frozen=True)
class CheckpointComparison:
    """The run's held-out questions at two evaluation steps."""

    run: Run
    metric: HeldoutMetric
    steps: tuple[int, ...]
    """Every evaluation step of the run (the choices for A and B), oldest first."""
    a: int
    b: int
    rows: tuple[ComparedQuestion, ...]

    @property
    def counts(self) -> dict[Change, int]:
        """How many rows each change has (every change present, zeros included)."""
        out: dict[Change, int] = dict.fromkeys(CHANGES, 0)
        for row in self.rows:
            out[row.change] += 1
        return out

    def accuracy(self, side: Literal["a", "b"]) -> tuple[int, int]:
        """``(right, n)`` at evaluation A or B: the held-out figure's numerator and denominator."""
        samples = [s for s in (getattr(row, side) for row in self.rows) if s is not None]
        return sum(s.correct for s in samples), len(samples)

    def filtered(self, change: Change | None) -> list[ComparedQuestion]:
        """The rows of one change (``None``: every row)."""
        return [row for row in self.rows if change is None or row.change == change]


def parse_change(value: str | None) -> Change | None:
    """A ``filter`` parameter as a change (empty or ``all``: ``None``; else ``UserError`` naming the choices)."""
    if not value or value == "all":
        return None
    for change in CHANGES:
        if value == change:
            return change
    raise UserError(f"filter must be one of all, {', '.join(CHANGES)}; got {value!r}")


def _keyed(rollouts: Sequence[t.Rollout]) -> dict[tuple[str, int], t.Rollout]:
    """Rollouts of one evaluation keyed by (task id, k-th sample of that task)."""
    out: dict[tuple[str, int], t.Rollout] = {}
    seen: dict[str, int] = {}
    for r in sorted(rollouts, key=lambda r: (r.created_at, r.rollout_id)):
        task = r.task_id or r.rollout_id
        k = seen.get(task, 0)
        seen[task] = k + 1
        out[(task, k)] = r
    return out


def _pick(name: str, value: int | None, steps: Sequence[int], default: int) -> int:
    if value is None:
        return default
    if value not in steps:
        raise UserError(f"{name}={value} is no evaluation step of this run; its evaluations are at steps {list(steps)}")
    return value


async def compare_checkpoints(
    store: Store, run_id: str, a: int | None = None, b: int | None = None
) -> CheckpointComparison:
    """The held-out questions of ``run_id`` at evaluation steps ``a`` and ``b`` (default: the first
    and the last evaluation). ``NotFoundError`` for an unknown run; ``UserError`` when the run
    names no held-out metric, has no finished evaluation, or ``a``/``b`` is not one of its steps."""
    run = await store.get_run(run_id)
    metric = heldout_metric(run.config)
    if metric is None:
        raise UserError(
            f"run {run_id} names no held-out metric, so no reply is right or wrong: record "
            '{"heldout_metric": {"name": ..., "threshold": ...}} in Trainer(run={"config": ...})'
        )
    by_step: dict[int, list[t.Rollout]] = {}
    for r in await heldout_rollouts(store, run_id):
        if r.mode is t.RolloutMode.VAL and r.step is not None and r.status.is_final:
            by_step.setdefault(r.step, []).append(r)
    steps = tuple(sorted(by_step))
    if not steps:
        raise UserError(f"run {run_id} has no finished held-out evaluation to compare")
    step_a, step_b = _pick("a", a, steps, steps[0]), _pick("b", b, steps, steps[-1])
    at_a, at_b = _keyed(by_step[step_a]), _keyed(by_step[step_b])
    chosen = list({r.rollout_id: r for r in [*at_a.values(), *at_b.values()]}.values())
    spans = await store.query_spans([r.rollout_id for r in chosen], latest_attempt_only=True)
    answers = {r.rollout_id: _answer(r, spans.get(r.rollout_id, []), metric) for r in chosen}

    def sample(r: t.Rollout | None) -> Sample | None:
        if r is None:
            return None
        return Sample(r.rollout_id, answers[r.rollout_id].reply, heldout_score(r), metric.correct(r) is True, r.status)

    rows = []
    for key in sorted(at_a.keys() | at_b.keys()):
        ra, rb = at_a.get(key), at_b.get(key)
        first = answers[next(r for r in (ra, rb) if r is not None).rollout_id]
        rows.append(
            ComparedQuestion(
                task_id=key[0] if key[1] == 0 else f"{key[0]} #{key[1] + 1}",
                question=first.question,
                expected=first.expected,
                a=sample(ra),
                b=sample(rb),
            )
        )
    return CheckpointComparison(run, metric, steps, step_a, step_b, tuple(rows))


def _answer(rollout: t.Rollout, spans: Sequence[t.Span], metric: HeldoutMetric) -> RolloutAnswer:
    return rollout_answer(rollout, llm_calls(spans), spans, metric)


def counts_json(comparison: CheckpointComparison) -> Mapping[str, object]:
    """The comparison's figures, JSON-ready (``/api/runs/<id>/compare``)."""
    right_a, n_a = comparison.accuracy("a")
    right_b, n_b = comparison.accuracy("b")
    return {
        "run_id": comparison.run.run_id,
        "metric": {"name": comparison.metric.name, "threshold": comparison.metric.threshold},
        "steps": list(comparison.steps),
        "a": {"step": comparison.a, "right": right_a, "n": n_a},
        "b": {"step": comparison.b, "right": right_b, "n": n_b},
        "counts": comparison.counts,
    }
