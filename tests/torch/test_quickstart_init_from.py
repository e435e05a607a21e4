"""``examples/quickstart/train.py --algorithm torch-sft`` then ``--init-from`` its checkpoint:
SFT then RL from the command line."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentbolt.store import RunStatus, open_store

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "quickstart" / "train.py"


def _train(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--store", f"sqlite:///{tmp_path}/q.db", "--no-progress"],
        capture_output=True,
        text=True,
        timeout=900,  # a loaded 2-core machine: minutes; pytest-timeout caps the test itself
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        cwd=tmp_path,
    )


def test_init_from_without_a_model_there_is_a_usage_error(tmp_path: Path) -> None:
    proc = _train("--init-from", str(tmp_path / "nothing"), tmp_path=tmp_path)
    assert proc.returncode == 2
    assert f"--init-from: init_from={tmp_path / 'nothing'}: no model there" in proc.stderr


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sft_then_grpo_from_its_checkpoint(tmp_path: Path) -> None:
    small = ("--model", "tiny", "--steps", "1", "--val", "4", "--batch-size", "2", "--group-size", "2")
    sft = _train(
        *small, "--algorithm", "torch-sft", "--threshold", "0", "--out", str(tmp_path / "sft"), tmp_path=tmp_path
    )
    assert sft.returncode == 0, sft.stderr[-3000:]
    checkpoint = tmp_path / "sft" / "checkpoint-final"
    assert (checkpoint / "model" / "config.json").is_file()
    rl = _train(*small, "--init-from", str(checkpoint), "--out", str(tmp_path / "rl"), tmp_path=tmp_path)
    assert rl.returncode == 0, rl.stderr[-3000:]
    assert "held-out accuracy" in rl.stdout

    async def runs() -> list[tuple[str, str | None, RunStatus]]:
        store = open_store(f"sqlite:///{tmp_path}/q.db")
        try:
            return sorted((r.algorithm, r.model, r.status) for r in await store.list_runs())
        finally:
            await store.close()

    assert asyncio.run(runs()) == [
        ("torch-grpo", str(checkpoint / "model"), RunStatus.SUCCEEDED),  # RL started from the SFT weights
        ("torch-sft", "tiny", RunStatus.SUCCEEDED),
    ]
