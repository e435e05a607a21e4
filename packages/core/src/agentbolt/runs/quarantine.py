"""Quarantine as ``agentbolt doctor`` and the dashboard show it.

Two sources, both durable:

- **what training did**: LightningRL's ``lightningrl/quarantined`` and
  ``lightningrl/quarantined/<reason>`` metrics, recorded with each step of a run (offline and
  ``agentbolt serve``); :func:`quarantined_in_metrics` adds them up over the run and
  :func:`quarantine_finding` turns them into a finding (the run page's training health and the
  doctor's run section);
- **what the store holds**: the reward values of stored rollouts that LightningRL would refuse
  (``Episode.quarantine`` of the same extraction training uses, which the doctor runs once per
  rollout), counted by the doctor before any training reads them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ..store.run_records import RunMetrics
from .findings import Finding

__all__ = ["QUARANTINE_FIX", "quarantine_finding", "quarantined_in_metrics"]

_METRIC = "lightningrl/quarantined"

QUARANTINE_FIX = (
    "send rewards as finite numbers (no bool, string, list or object) within 1e15 in magnitude and the "
    "declared reward_range; see docs/rewards.md (the rest of each step trained)"
)


def quarantined_in_metrics(rows: Iterable[RunMetrics]) -> dict[str, int]:
    """Rollouts quarantined over a run's recorded steps, by reason (``""``: all reasons)."""
    out: dict[str, int] = {}
    for row in rows:
        for name, value in row.values.items():
            if name == _METRIC:
                out[""] = out.get("", 0) + int(value)
            elif name.startswith(_METRIC + "/"):
                reason = name[len(_METRIC) + 1 :]
                out[reason] = out.get(reason, 0) + int(value)
    return out


def quarantine_finding(run_id: str, counts: Mapping[str, int]) -> Finding | None:
    """A ``quarantined`` finding of a run from :func:`quarantined_in_metrics`, or ``None``."""
    total = counts.get("", 0)
    if not total:
        return None
    reasons = ", ".join(f"{reason} x{n}" for reason, n in sorted(counts.items()) if reason)
    return Finding(
        "quarantined",
        "warning",
        total,
        f"training quarantined {total} rollouts whose values would have stopped or misled a step ({reasons})",
        QUARANTINE_FIX,
        run_id,
    )
