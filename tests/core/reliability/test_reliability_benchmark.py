"""The fast subset of benchmarks/reliability.py: crash recovery with real processes and SIGKILL."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "reliability.py"


def test_quick_crash_rows_hold() -> None:
    """R1 (runner processes killed -9 mid-rollout) and R2 (store server killed -9, SQLite)."""
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--rows", "R1,R2", "--rollouts", "60"],
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    rows = [line for line in result.stdout.splitlines() if line.startswith("| R")]
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert len(rows) == 2 and all(row.endswith("| yes |") for row in rows), result.stdout
