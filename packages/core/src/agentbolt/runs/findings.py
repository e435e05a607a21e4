"""A finding: one problem (or fact worth knowing) that ``agentbolt doctor`` reports, with what to do.

Shared by the capture checks (:mod:`agentbolt.runs.doctor`) and the training-health checks
(:mod:`agentbolt.runs.health`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["Finding", "Severity"]

Severity = Literal["error", "warning", "info"]


@dataclass(frozen=True)
class Finding:
    """One problem (or fact worth knowing) about what was captured or how training went."""

    code: str
    """Stable identifier, e.g. ``missing_token_ids``."""
    severity: Severity
    count: int
    """How many calls, rollouts, groups or tokens it concerns."""
    message: str
    """What happened."""
    fix: str
    """What to do about it."""
    run_id: str | None = None
    """The run it concerns (training-health findings), if any."""
