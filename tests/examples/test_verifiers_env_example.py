"""examples/verifiers_env: a verifiers environment (written with verifiers' own API) trained with
torch-grpo through agentbolt-verifiers on the tiny model: the environment's own episodes run, every
call is captured with exact ids, and held-out questions share nothing with the training ones."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "verifiers_env"


@pytest.mark.timeout(900)  # tiny-model GRPO over verifiers episodes; slow on a busy 2-core machine
def test_train_script_runs_two_steps_on_the_tiny_model(tmp_path: Path) -> None:
    db = tmp_path / "vf.db"
    proc = subprocess.run(
        [
            sys.executable,
            str(EXAMPLE / "train.py"),
            *("--model", "tiny", "--steps", "2", "--val", "4", "--val-every", "2"),
            *("--batch-size", "2", "--group-size", "2", "--max-tokens", "8", "--no-progress"),
            *("--store", f"sqlite:///{db}", "--out", str(tmp_path / "out")),
        ],
        capture_output=True,
        text=True,
        timeout=850,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "held-out accuracy" in proc.stdout
    result = json.loads((tmp_path / "out/result.json").read_text())
    assert result["example"] == "verifiers_env" and result["steps"] == 2
    assert result["heldout"]["heldout"]["n"] == 4
    metrics = [json.loads(line) for line in (tmp_path / "out/metrics.jsonl").read_text().splitlines() if line.strip()]
    trained = [m for m in metrics if "lightningrl/calls" in m]
    assert len(trained) == 2
    for m in trained:  # every rollout's one call reached the gateway and trained, none flagged or failed
        assert m["lightningrl/rollouts"] == 4 and m["train/failed"] == 0
        assert m["lightningrl/reconciliation/gateway_calls"] == m["lightningrl/trained_calls"] == 4
        assert m["lightningrl/reconciliation/flagged_rollouts"] == 0
        assert m["lightningrl/final_reward_sources/span"] == 4  # the environment's score, as a reward span


def test_heldout_and_train_splits_share_no_question() -> None:
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(EXAMPLE)!r})
        from add_env import AddConfig, AddTaskset, is_heldout
        train = AddTaskset(AddConfig(id="add-env", split="train")).load()
        held = AddTaskset(AddConfig(id="add-env", split="heldout", num_tasks=10_000)).load()
        pairs = lambda ts: {{t.data.prompt[-1].content for t in ts}}
        assert not pairs(train) & pairs(held)
        assert len(train) == len(pairs(train)) and len(held) == len(pairs(held))
        assert all(t.data.answer == sum(map(int, t.data.prompt[-1].content[8:-1].split(" + "))) for t in train + held)
        print(len(train), len(held))
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    n_train, n_held = map(int, proc.stdout.split())
    assert n_train + n_held == 40 * 30  # every operand pair is in exactly one split
