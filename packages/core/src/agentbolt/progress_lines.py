"""Progress as plain lines, for a trainer whose console is not a terminal (a log file, CI).

Progress bars only make sense where they redraw. Written to a file, rich draws the bars once, at
the end, 80 columns wide, each row beside whatever metrics were latest when its phase began: the
held-out phase then read ``held-out (96 tas… step 10: reward=...``, a training step's figures
under a held-out label. :class:`LineProgress` writes one complete line per finished phase and one
per step's metrics instead, each stamped with the time and never wrapped::

    [12:53:28] held-out (96 tasks): 96/96 in 53.9 s
    [12:53:28] step 0: val/accuracy=0.3021, val/reward=0.3646
    [12:55:36] step 1 rollouts: 32/32 in 17.4 s
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from rich.console import Console

__all__ = ["LineProgress"]


class _LinePhase:
    """One phase: counts what is done, writes its line when done."""

    def __init__(self, owner: LineProgress, description: str, total: int | None) -> None:
        self._owner = owner
        self._description = description
        self._total = total
        self._done = 0
        self._started = time.monotonic()
        self._finished = False

    def advance(self, n: int = 1) -> None:
        self._done += n

    def done(self) -> None:
        if self._finished:
            return
        self._finished = True
        of = f"/{self._total}" if self._total is not None else ""
        self._owner.line(f"{self._description}: {self._done}{of} in {time.monotonic() - self._started:.1f} s")


class LineProgress:
    """A :class:`~agentbolt.algorithm.ProgressReporter` writing whole lines to ``console``."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def line(self, text: str) -> None:
        """Write ``[HH:MM:SS] text`` on one line, as it is (no markup, no wrapping)."""
        self.console.print(
            f"[{time.strftime('%H:%M:%S')}] {text}", markup=False, highlight=False, soft_wrap=True, crop=False
        )

    def phase(self, description: str, total: int | None) -> _LinePhase:
        """Start a phase; its line is written when it is done."""
        return _LinePhase(self, description, total)

    def metrics(self, step: int, values: Mapping[str, float]) -> None:
        """One line of a step's metrics, each under its own name."""
        self.line(f"step {step}: " + ", ".join(f"{k}={v:.4g}" for k, v in values.items()))
