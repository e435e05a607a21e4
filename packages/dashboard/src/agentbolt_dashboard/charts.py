"""The run page's grid of charts: every recorded metric, grouped by its prefix, held-out first.

The held-out group draws the run's summary card (:mod:`agentbolt.runs.summary`): each
evaluation's mean with a band of ± one standard error and its ``n``, under the name the example
gives its metric (``held-out accuracy``). The other groups draw the recorded metrics
(``train/*``, ``update/*``, ``health/*``...), smoothed in the browser. The charts shown by default
are :data:`DEFAULT_CHARTS` (those the run recorded); the page keeps the reader's choice and the
smoothing in its URL (``?charts=train/reward,update/kl&smooth=0.6``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentbolt.runs import views
from agentbolt.runs.summary import RunSummary

__all__ = ["DEFAULT_CHARTS", "GROUP_ORDER", "ChartGroup", "chart_groups", "heldout_series"]

HELDOUT_PREFIX = "heldout:"
"""Chart keys of the held-out figures (``heldout:accuracy``, ``heldout:reward``): drawn from
rollouts with standard errors, not from the recorded ``val/*`` metrics."""

DEFAULT_CHARTS = (
    "train/reward",
    "update/loss",
    "update/kl",
    "update/entropy",
    "health/near_certain_share",
    "health/tool_call_rate",
    "time/step_s",
)
"""Shown without a choice in the URL, after the held-out charts."""

GROUP_ORDER = ("heldout", "train", "update", "health", "lightningrl", "time", "engine")
"""Groups in page order (others follow alphabetically)."""

GROUP_LABELS = {
    "heldout": "held-out (mean ± 1 se over the held-out rollouts)",
    "train": "training",
    "update": "update",
    "health": "sampling health",
    "lightningrl": "LightningRL",
    "time": "time",
    "engine": "generation engine",
    "val": "held-out, as recorded by the algorithm",
}


@dataclass(frozen=True)
class ChartGroup:
    """One prefix's charts: ``(key, label)`` pairs."""

    name: str
    label: str
    charts: list[tuple[str, str]]


def chart_groups(latest: Mapping[str, float], policies: Sequence[str], card: RunSummary) -> list[ChartGroup]:
    """Every chart the run can show, grouped by prefix, held-out first."""
    groups: dict[str, list[tuple[str, str]]] = {}
    for h in card.heldout:
        groups.setdefault("heldout", []).append((HELDOUT_PREFIX + h.metric, h.label))
    for key, label in views.metric_names(latest, policies):
        groups.setdefault(key.split("/", 1)[0] if "/" in key else "other", []).append((key, label))
    order = {name: i for i, name in enumerate(GROUP_ORDER)}
    names = sorted(groups, key=lambda g: (order.get(g, len(order)), g))
    return [ChartGroup(g, GROUP_LABELS.get(g, g), groups[g]) for g in names]


def default_charts(groups: Sequence[ChartGroup]) -> list[str]:
    """The held-out charts, then :data:`DEFAULT_CHARTS` the run recorded."""
    known = {key for g in groups for key, _ in g.charts}
    heldout = [key for g in groups if g.name == "heldout" for key, _ in g.charts]
    return heldout + [k for k in DEFAULT_CHARTS if k in known]


def heldout_series(card: RunSummary) -> dict[str, dict[str, Any]]:
    """The held-out charts' data: per figure, its label and each evaluation's step, mean, se and n."""
    return {
        HELDOUT_PREFIX + h.metric: {
            "label": h.label,
            "steps": [e.step for e in h.evaluations],
            "mean": [e.mean for e in h.evaluations],
            "se": [e.se for e in h.evaluations],
            "n": [e.n for e in h.evaluations],
        }
        for h in card.heldout
    }
