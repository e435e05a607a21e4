"""Held-out evaluation of a finished training run, and the run record that publishes it.

A training run measures its held-out tasks before and after training (``val0`` and ``val{N}``
rollouts). :func:`read_heldout` reads those rollouts back from the store with what each scored
(the final reward and, when the agent emitted named reward dimensions, each dimension), so a
script can report several held-out sets and several metrics from one evaluation.
:func:`mean_and_se` gives a mean with its standard error; :class:`RunRecord` is the shape of a
published run record (``docs/runs/<example>/result.json``), which README figures are generated
from; :func:`provenance` fills in where and from what it ran::

    outcomes = asyncio.run(read_heldout("sqlite:///runs/x.db", ["val0", "val16"]))
    before, before_se = mean_and_se([o.score("exact_match") for o in outcomes["val0"]])
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .. import semconv
from .. import types as t
from ..store import Store, open_store

__all__ = [
    "HeldoutOutcome",
    "RunRecord",
    "SetScore",
    "latest_run",
    "mean_and_se",
    "paired_gain",
    "provenance",
    "read_heldout",
    "set_score",
]


def mean_and_se(values: Sequence[float]) -> tuple[float, float]:
    """Mean and its standard error, ``pstdev / sqrt(n)`` (``sqrt(p(1-p)/n)`` for 0/1 values).

    Raises ``ValueError`` on an empty sequence: a held-out set without outcomes has no score.
    """
    if not values:
        raise ValueError("mean_and_se of no values")
    return statistics.fmean(values), statistics.pstdev(values) / math.sqrt(len(values))


def paired_gain(before: Sequence[float], after: Sequence[float]) -> tuple[float, float | None]:
    """The mean per-item gain ``after - before`` over the same items (same order) and its standard
    error from the per-item differences: ``stdev(after_i - before_i) / sqrt(n)`` (``None`` for one item).

    One fixed held-out set measured twice gives correlated outcomes (a question the model answers
    before, it mostly answers after), so the gain's own error is smaller than
    ``hypot(se_before, se_after)``, which treats the two measurements as independent samples of
    questions and overstates the noise of a gain (E. Miller, "Adding Error Bars to Evals", 2024,
    on paired differences). Records give both: :attr:`SetScore.gain_in_se` (independent, the
    stricter) and :attr:`SetScore.paired_gain_in_se`.
    """
    if len(before) != len(after):
        raise ValueError(f"before has {len(before)} outcomes, after {len(after)}: they must be the same items")
    if not before:
        raise ValueError("paired_gain of no values")
    diffs = [a - b for b, a in zip(before, after, strict=True)]
    se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else None
    return statistics.fmean(diffs), se


# -- reading a run's held-out rollouts back --------------------------------------------------------


@dataclass(frozen=True)
class HeldoutOutcome:
    """One held-out rollout: its task, whether it finished, its final reward and reward dimensions."""

    rollout_id: str
    task_id: str
    succeeded: bool
    reward: float | None
    dimensions: Mapping[str, float] = field(default_factory=dict)
    """The named dimensions of the rollout's final reward span (:func:`agentbolt.capture.emit.emit_reward`)."""
    tool_calls: tuple[str, ...] = ()
    """Names of the tools the model called, in call order (from the gateway's recorded replies)."""

    def score(self, metric: str | None = None) -> float:
        """The outcome on ``metric`` (a reward dimension; ``None``: the final reward); 0 for a failed rollout."""
        if not self.succeeded:
            return 0.0
        value = self.reward if metric is None else self.dimensions.get(metric)
        if value is None and metric is not None:
            raise KeyError(f"task {self.task_id}: no reward dimension {metric!r} (has {sorted(self.dimensions)})")
        return float(value or 0.0)


async def _rollouts(store: Store, mode: t.RolloutMode) -> list[t.Rollout]:
    rollouts: list[t.Rollout] = []
    cursor = None
    while True:
        page = await store.query_rollouts(mode=mode, limit=1000, cursor=cursor)
        rollouts.extend(page.items)
        cursor = page.next_cursor
        if not cursor:
            return rollouts


async def latest_run(store_url: str) -> str | None:
    """The run of the last held-out rollout enqueued in the store (``None`` without one)."""
    store = open_store(store_url)
    try:
        rollouts = await _rollouts(store, t.RolloutMode.VAL)
    finally:
        await store.close()
    return rollouts[-1].run_id if rollouts else None


def _dimensions(spans: Iterable[t.Span]) -> dict[str, float]:
    """The dimensions of the last final reward span (else the last reward span) of a rollout."""
    rewards = [s for s in spans if s.name == semconv.SPAN_REWARD and semconv.REWARD_DIMENSIONS in s.attributes]
    if not rewards:
        return {}
    chosen = ([s for s in rewards if s.attributes.get(semconv.REWARD_IS_FINAL)] or rewards)[-1]
    return {k: float(v) for k, v in json.loads(chosen.attributes[semconv.REWARD_DIMENSIONS]).items()}


def _tool_calls(spans: Iterable[t.Span]) -> tuple[str, ...]:
    """Tool names the model called, from the Chat Completions replies the gateway recorded."""
    names: list[str] = []
    for span in spans:
        body = span.attributes.get(semconv.LLM_RESPONSE)
        if not body:
            continue
        try:
            choices = json.loads(body).get("choices") or []
        except (TypeError, ValueError, AttributeError):
            continue
        for choice in choices:
            for call in (choice.get("message") or {}).get("tool_calls") or []:
                names.append(str((call.get("function") or {}).get("name")))
    return tuple(names)


async def read_heldout(
    store_url: str, tags: Sequence[str], *, run_id: str | None = None, spans: bool = True
) -> dict[str, list[HeldoutOutcome]]:
    """The held-out rollouts of one run per evaluation tag (``val0``, ``val16``, ...), in task order.

    ``run_id`` defaults to :func:`latest_run`. A rollout that did not succeed (timed out,
    failed) is kept with ``succeeded=False``: it scores 0, so a slow evaluation cannot leave
    hard tasks out. ``spans=False`` skips reading the spans (no dimensions, no tool calls).
    """
    store = open_store(store_url)
    try:
        rollouts = await _rollouts(store, t.RolloutMode.VAL)
        run_id = run_id or (rollouts[-1].run_id if rollouts else None)
        rollouts = [r for r in rollouts if r.run_id == run_id]
        out: dict[str, list[HeldoutOutcome]] = {}
        for tag in tags:
            mine = [r for r in rollouts if (r.group_id or "").split(":")[1:2] == [tag]]
            found: dict[str, list[t.Span]] = {}
            if spans:
                ids = [r.rollout_id for r in mine]
                for i in range(0, len(ids), 200):
                    found.update(await store.query_spans(ids[i : i + 200], latest_attempt_only=True))
            out[tag] = [
                HeldoutOutcome(
                    rollout_id=r.rollout_id,
                    task_id=r.task_id or "",
                    succeeded=r.status is t.RolloutStatus.SUCCEEDED,
                    reward=r.final_reward,
                    dimensions=_dimensions(found.get(r.rollout_id, [])),
                    tool_calls=_tool_calls(found.get(r.rollout_id, [])),
                )
                for r in mine
            ]
        return out
    finally:
        await store.close()


# -- the run record --------------------------------------------------------------------------------


class SetScore(BaseModel):
    """One held-out set's headline metric before and after training, with standard errors."""

    model_config = ConfigDict(extra="forbid")
    metric: str
    """What the numbers measure (``exact_match``, ``execution_accuracy``, ...)."""
    n: int = Field(ge=1)
    """Held-out items the means are over."""
    before: float
    before_se: float = Field(ge=0)
    after: float
    after_se: float = Field(ge=0)
    stages: dict[str, dict[str, float]] = Field(default_factory=dict)
    """Optional: more measurements of the set (another metric, an intermediate stage, ...)."""
    gain_se_paired: float | None = Field(default=None, ge=0)
    """The gain's standard error from the per-item differences (:func:`paired_gain`); ``None`` in
    records written before it was kept, or with one item."""

    @property
    def gain_in_se(self) -> float:
        """``(after - before) / sqrt(se_before^2 + se_after^2)`` (``inf``/``nan`` when both are 0):
        the two measurements taken as independent, the stricter of the two gains a record gives."""
        return _z(self.after - self.before, math.hypot(self.before_se, self.after_se))

    @property
    def paired_gain_in_se(self) -> float | None:
        """``(after - before) / gain_se_paired``: the gain in its own standard errors, the same
        items measured twice (:func:`paired_gain`); ``None`` when the record has no paired error."""
        if self.gain_se_paired is None:
            return None
        return _z(self.after - self.before, self.gain_se_paired)


def _z(diff: float, se: float) -> float:
    return diff / se if se else (math.copysign(math.inf, diff) if diff else math.nan)


def set_score(metric: str, before: Sequence[float], after: Sequence[float], **stages: dict[str, float]) -> SetScore:
    """A :class:`SetScore` from per-item outcomes before and after training (same items, same order)."""
    if len(before) != len(after):
        raise ValueError(f"before has {len(before)} outcomes, after {len(after)}: they must be the same items")
    (b, b_se), (a, a_se) = mean_and_se(before), mean_and_se(after)
    return SetScore(
        metric=metric,
        n=len(before),
        before=b,
        before_se=b_se,
        after=a,
        after_se=a_se,
        stages=stages,
        gain_se_paired=paired_gain(before, after)[1],
    )


class RunRecord(BaseModel):
    """A published training run (``docs/runs/<example>/result.json``): what ran, where, what it measured."""

    model_config = ConfigDict(extra="forbid")
    example: str
    command: str
    """The command line exactly as run."""
    commit: str
    """The git commit the run used (``+dirty`` when the work tree had changes)."""
    date: str
    """``YYYY-MM-DD`` (UTC) of the run's start."""
    machine: str
    model: str
    steps: int = Field(ge=0)
    wall_s: float = Field(ge=0)
    """The whole run's wall time, loading and every evaluation included."""
    s_per_step: float = Field(ge=0)
    """Seconds per training step, the mean over the run's steps (not the last step's)."""
    heldout: dict[str, SetScore]
    """Each held-out set by its name (``arithmetic``, ``unseen_dbs``, ``dev``...): the metric the
    example names (``accuracy``, ``execution_accuracy``...) before and after training."""
    headline: str
    """``<set>/<metric>``: the figure the example leads with."""
    extra: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _headline_names_a_set(self) -> RunRecord:
        name, _, metric = self.headline.partition("/")
        if name not in self.heldout or self.heldout[name].metric != metric:
            known = [f"{k}/{v.metric}" for k, v in self.heldout.items()]
            raise ValueError(f"headline {self.headline!r} is not one of the held-out sets' metrics {known}")
        return self

    @classmethod
    def load(cls, path: str | Path) -> RunRecord:
        return cls.model_validate_json(Path(path).read_text(encoding="utf-8"))

    def write(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.model_dump_json(indent=2) + "\n", encoding="utf-8")
        return path


RECORDED_ENV = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MKL_NUM_THREADS")
"""Environment settings a run record's command shows when they are set (thread counts and waits)."""


def _git(*args: str, cwd: Path) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


def _machine(device: str) -> str:
    cores = os.cpu_count() or 0
    flags = ""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
        flags = next((line for line in cpuinfo.splitlines() if line.startswith("flags")), "")
    except OSError:
        pass
    simd = "AVX-512" if " avx512f" in flags else "AVX2" if " avx2" in flags else platform.machine()
    return f"{cores} vCPU, {simd}, " + ("no GPU" if device == "cpu" else device)


def provenance(
    argv: Sequence[str] | None = None, *, repo: str | Path | None = None, device: str = "cpu"
) -> dict[str, str]:
    """``command``, ``commit``, ``date`` and ``machine`` of this process, for a :class:`RunRecord`.

    ``command`` is ``python <argv...>`` with the script path relative to the repository, led by
    the settings of :data:`RECORDED_ENV` that are set (they change speed, not results);
    ``commit`` is ``git rev-parse HEAD`` of ``repo`` (default: the script's repository), with
    ``+dirty`` when tracked files differ from it, or ``unknown`` outside a git checkout.
    ``machine`` names the CPU count, its vector extensions and ``device`` ("no GPU" for ``cpu``).
    """
    argv = list(sys.argv if argv is None else argv)
    root = Path(repo) if repo else Path(argv[0]).resolve().parent if argv and argv[0] else Path.cwd()
    top = _git("rev-parse", "--show-toplevel", cwd=root)
    script = argv[0] if argv else ""
    if top and script:
        try:
            script = str(Path(script).resolve().relative_to(top))
        except ValueError:
            pass
    commit = "unknown"
    if top:
        sha = _git("rev-parse", "HEAD", cwd=Path(top)) or "unknown"
        dirty = _git("status", "--porcelain", "--untracked-files=no", cwd=Path(top))
        commit = f"{sha}+dirty" if dirty else sha
    env = [f"{k}={os.environ[k]}" for k in RECORDED_ENV if k in os.environ]
    return {
        "command": shlex.join([*env, "python", script, *argv[1:]]),
        "commit": commit,
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d"),
        "machine": _machine(device),
    }
