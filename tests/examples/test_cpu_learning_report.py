"""benchmarks/cpu_learning.py --report describes the run it reads, not today's command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _arm(steps: int, val: int, settings: bool = True) -> dict:
    history = [{"step": 0, "val/accuracy": 0.2}] + [
        {"step": i, "train/reward": 0.3, "time/step_s": 2.0, "time/rollouts_s": 1.0, "time/update_s": 1.0}
        for i in range(1, steps + 1)
    ]
    arm = {"accuracy_before": 0.2, "accuracy_after": 0.5, "step_times": [2.0] * steps, "history": history}
    if settings:
        arm["settings"] = {"steps": steps, "val": val, "batch": 8, "group": 4}
    return arm


def _report(out: Path) -> str:
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks/cpu_learning.py"), "--report", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_report_header_comes_from_the_arms_files(tmp_path: Path) -> None:
    for name in ("bare", "agentbolt"):
        (tmp_path / f"{name}.json").write_text(json.dumps(_arm(6, 16)))
    out = _report(tmp_path)
    assert "SmolLM2-135M, 6 steps x 8x4 samples, 16 held-out questions at T=1.0" in out
    assert "30 steps" not in out and "96 held-out" not in out
    (tmp_path / "bare.json").write_text(json.dumps(_arm(4, 16)))
    assert "bare: 4 steps x 8x4 samples, 16 held-out questions; agentbolt: 6 steps" in _report(tmp_path)
    (tmp_path / "bare.json").write_text(json.dumps(_arm(6, 16, settings=False)))
    assert "settings not recorded in the JSON of bare" in _report(tmp_path)
