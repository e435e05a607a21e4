"""``examples/openenv_env`` end to end on the tiny model: train.py starts the OpenEnv server (its
Python server mode, a subprocess), trains one step through a runner process and agentbolt-torch,
evaluates the held-out episodes before and after, and writes its run record.

The tiny random model never writes an ``<action>``, so every episode ends at ``max_turns`` without
a step: its reward is the agent's ``truncated_reward`` (0.0) and every call was still captured
with exact token ids. That the server's rewards reach training is tests/openenv's part.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.runs.evaluation import RunRecord
from agentbolt.store import open_store

REPO = Path(__file__).resolve().parents[2]

# starts the OpenEnv server and the torch trainer: minutes on 2 shared cores, past the suite's 300 s default
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def test_train_py_runs_on_the_tiny_model(tmp_path: Path) -> None:
    pytest.importorskip("agentbolt_torch")
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    cmd = [
        sys.executable,
        str(REPO / "examples/openenv_env/train.py"),
        "--model",
        "tiny",
        "--steps",
        "1",
        "--batch-size",
        "2",
        "--group-size",
        "2",
        "--val",
        "4",
        "--store",
        store,
        "--out",
        str(tmp_path / "out"),
        "--no-progress",
        "--runners",
        "0",  # the runner in the trainer's process (the published run uses a runner process)
    ]
    done = subprocess.run(
        cmd, cwd=tmp_path, capture_output=True, text=True, timeout=1100, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "OpenEnv server up at http://127.0.0.1:" in done.stderr

    record = RunRecord.load(tmp_path / "out" / "result.json")
    assert record.example == "openenv_env" and record.model == "tiny (random)"
    assert record.heldout["heldout"].n == 4 and record.heldout["heldout"].metric == "accuracy"

    async def read() -> tuple[list[t.Rollout], dict[str, list[t.Span]]]:
        s = open_store(store)
        try:
            page = await s.query_rollouts(limit=100)
            return list(page.items), await s.query_spans([r.rollout_id for r in page.items], latest_attempt_only=True)
        finally:
            await s.close()

    rollouts, spans = asyncio.run(read())
    assert {r.mode for r in rollouts} == {t.RolloutMode.TRAIN, t.RolloutMode.VAL}
    assert len([r for r in rollouts if r.mode is t.RolloutMode.TRAIN]) == 4
    assert len([r for r in rollouts if r.mode is t.RolloutMode.VAL]) == 8  # before and after
    for rollout in rollouts:
        assert rollout.status is t.RolloutStatus.SUCCEEDED, rollout.error
        calls = [s for s in spans[rollout.rollout_id] if s.name == semconv.SPAN_LLM_CALL]
        assert calls and all(s.attributes.get(semconv.TOKEN_SOURCE) == "exact" for s in calls)
        # the session's reset is recorded; with no valid action there is no step
        steps = [s.attributes.get("openenv.step") for s in spans[rollout.rollout_id] if "openenv.step" in s.attributes]
        assert 0 in steps
        if len(steps) == 1:  # no step: the episode was cut, reward truncated_reward
            assert rollout.final_reward == 0.0
