"""The reward debugger of a run (the dashboard's ``/runs/{id}/rewards``), computed from the store.

Training and held-out rewards are kept apart (held-out rollouts are never trained on); a reward
that takes a few values is counted value by value, not in bins; each training step's groups
whose samples all got the same reward (zero advantage: they train nothing) are counted; the
calls with the largest |advantage| are listed. LightningRL runs at view time with the run's
settings (:func:`agentbolt.runs.views.lightningrl_for`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import types as t
from ..store.base import Store
from ..store.run_records import RolloutSearch, Run
from .views import lightningrl_for

__all__ = ["DISCRETE_VALUES", "RewardDebugger", "RewardPanel", "StepSpread", "histogram", "reward_debugger"]


DISCRETE_VALUES = 12
"""A reward taking at most this many distinct values is shown value by value, not in bins."""


def histogram(values: Sequence[float], bins: int = 10) -> list[dict[str, Any]]:
    """``[{lo, hi, n, pct}]`` (``pct`` of the fullest bar): one bar per value (``lo == hi``) when
    the values take at most :data:`DISCRETE_VALUES` distinct values (a reward of 0, 0.1 or 1 reads
    as three bars, never as "0.1-0.2"), else equal-width bins over their range."""
    if not values:
        return []
    distinct = Counter(values)
    if len(distinct) <= DISCRETE_VALUES:
        top = max(distinct.values())
        return [{"lo": v, "hi": v, "n": n, "pct": n / top * 100} for v, n in sorted(distinct.items())]
    lo, hi = min(values), max(values)
    width = (hi - lo) / bins
    counts = [0] * bins
    for v in values:
        counts[min(int((v - lo) / width), bins - 1)] += 1
    top = max(counts)
    return [
        {"lo": lo + i * width, "hi": lo + (i + 1) * width, "n": n, "pct": n / top * 100} for i, n in enumerate(counts)
    ]


@dataclass(frozen=True)
class StepSpread:
    """One training step's groups, and those whose samples all got the same reward (they train nothing)."""

    step: int
    groups: int
    zero_spread: int

    @property
    def share(self) -> float:
        return self.zero_spread / self.groups if self.groups else 0.0


@dataclass
class RewardPanel:
    """The rewards of one kind of rollout (training or held-out)."""

    rollouts: int = 0
    per_agent: dict[str, dict[str, list[dict[str, Any]]]] = field(default_factory=dict)
    """agent name -> reward name (``final`` and each dimension) -> histogram."""
    stats: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    """agent name -> reward name -> {n, mean, min, max}."""
    same_as_final: dict[str, list[str]] = field(default_factory=dict)
    """agent name -> dimensions equal to the final reward in every rollout (not drawn twice)."""


@dataclass
class RewardDebugger:
    """The reward debugger page of a run."""

    run: Run
    rollouts: int
    panels: dict[str, RewardPanel]
    """``training`` and ``held-out``: never mixed (held-out rollouts are never trained on)."""
    spread: list[StepSpread]
    """Training steps, oldest first, with their zero-spread groups."""
    top: list[tuple[t.Transition, str | None]]
    """Transitions with the largest |advantage| (with their agent name)."""
    excluded: dict[str, int]


def _panel(episodes: Sequence[Any]) -> RewardPanel:
    panel = RewardPanel(rollouts=len(episodes))
    values: dict[str, dict[str, list[float]]] = {}
    for ep in episodes:
        agents = sorted({c.agent_name or "(no agent)" for c in ep.calls}) or ["(no agent)"]
        for agent in agents:
            slot = values.setdefault(agent, {})
            slot.setdefault("final", []).append(ep.final_reward if ep.final_reward is not None else math.nan)
            for rec in ep.rewards:
                for name, v in (rec.dimensions or {}).items():
                    if isinstance(v, int | float) and math.isfinite(v):
                        slot.setdefault(name, []).append(float(v))
    for agent, d in values.items():
        final = d.get("final", [])
        same = [k for k, v in d.items() if k != "final" and v == final]
        panel.same_as_final[agent] = same
        clean = {k: [x for x in v if math.isfinite(x)] for k, v in d.items() if k not in same}
        panel.per_agent[agent] = {k: histogram(v) for k, v in clean.items() if v}
        panel.stats[agent] = {
            k: {"n": len(v), "mean": sum(v) / len(v), "min": min(v), "max": max(v)} for k, v in clean.items() if v
        }
    return panel


def _spread(rollouts: Sequence[t.Rollout]) -> list[StepSpread]:
    groups: dict[tuple[int, str], set[float | None]] = {}
    for r in rollouts:
        if r.mode is t.RolloutMode.TRAIN and r.step is not None and r.group_id is not None:
            groups.setdefault((r.step, r.group_id), set()).add(r.final_reward)
    steps: dict[int, list[int]] = {}
    for (step, _), rewards in groups.items():
        tally = steps.setdefault(step, [0, 0])
        tally[0] += 1
        tally[1] += len(rewards) == 1
    return [StepSpread(step, n, zero) for step, (n, zero) in sorted(steps.items())]


async def reward_debugger(store: Store, run_id: str, *, max_rollouts: int = 400, top: int = 20) -> RewardDebugger:
    """Rewards and reward dimensions per agent, training and held-out apart; each training step's
    groups without reward spread; the calls with the largest |advantage| — over the run's latest
    ``max_rollouts`` finished rollouts (``NotFoundError`` for an unknown run)."""
    run = await store.get_run(run_id)
    rollouts: list[t.Rollout] = []
    offset = 0
    while len(rollouts) < max_rollouts:
        page = await store.search_rollouts(
            RolloutSearch(
                run_id=run_id,
                status=[t.RolloutStatus.SUCCEEDED, t.RolloutStatus.FAILED],
                limit=min(500, max_rollouts - len(rollouts)),
                offset=offset,
            )
        )
        rollouts.extend(page.items)
        offset += len(page.items)
        if not page.items or offset >= page.total:
            break
    spans: dict[str, list[t.Span]] = {}
    ids = [r.rollout_id for r in rollouts]
    for i in range(0, len(ids), 200):
        spans.update(await store.query_spans(ids[i : i + 200], latest_attempt_only=True))
    batch = lightningrl_for(run).process(rollouts, spans) if rollouts else None
    agent_of: dict[tuple[str, str | None], str | None] = {}
    mode_of = {r.rollout_id: r.mode for r in rollouts}
    episodes: dict[str, list[Any]] = {"training": [], "held-out": []}
    if batch is not None:
        for ep in batch.episodes:
            for c in ep.calls:
                if c.gateway_span is not None:
                    agent_of[(ep.rollout_id, c.gateway_span.span_id)] = c.agent_name
            episodes["held-out" if mode_of.get(ep.rollout_id) is t.RolloutMode.VAL else "training"].append(ep)
    ranked = sorted(
        (
            x
            for x in (batch.transitions if batch else [])
            if x.advantage is not None and mode_of.get(x.rollout_id) is not t.RolloutMode.VAL
        ),
        key=lambda x: -abs(x.advantage or 0.0),
    )[:top]
    return RewardDebugger(
        run=run,
        rollouts=len(rollouts),
        panels={k: _panel(v) for k, v in episodes.items()},
        spread=_spread(rollouts),
        top=[(x, agent_of.get((x.rollout_id, x.span_id))) for x in ranked],
        excluded=dict(batch.report.excluded) if batch else {},
    )
