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
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.runs.evaluation import RunRecord
from agentbolt.store import open_store
from agentbolt_openenv import OpenEnvServerError, check_server

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "openenv_env"


# starts the OpenEnv server and the torch trainer: minutes on 2 shared cores, past the suite's 300 s default
@pytest.mark.slow
@pytest.mark.timeout(1200)
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


def test_heldout_and_train_episodes_share_no_problem() -> None:
    """The ``test`` split's episodes (the held-out set) never ask a problem a ``train`` episode
    asks, whatever the seed: the splits partition the problems, and episodes draw only from theirs."""
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(EXAMPLE)!r})
        from openenv_arith import PROBLEMS, SPLITS, episode_problems
        train, test = set(SPLITS["train"]), set(SPLITS["test"])
        assert not train & test and train | test == set(PROBLEMS) and len(PROBLEMS) == len(set(PROBLEMS))
        asked_train = {{p for seed in range(4000) for p in episode_problems(seed, "train")}}
        asked_test = {{p for seed in range(200) for p in episode_problems(seed, "test")}}
        assert asked_train <= train and asked_test <= test and not asked_train & asked_test
        print(len(train), len(test), len(asked_test))
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    n_train, n_test, asked_test = map(int, proc.stdout.split())
    assert n_train + n_test == 1160 and n_test > 0 and asked_test > 0


def test_the_server_train_py_starts_dies_with_it_at_kill_9(tmp_path: Path) -> None:
    """train.py's OpenEnv server subprocess does not outlive a train.py killed with SIGKILL."""
    code = textwrap.dedent(
        f"""
        import sys, time
        sys.path.insert(0, {str(EXAMPLE)!r})
        from train import environment_server
        with environment_server(None, sessions=2) as url:
            print(url, flush=True)
            time.sleep(600)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url
        check_server(url)  # up
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        for _ in range(120):  # the server gets SIGTERM from the kernel and shuts down
            try:
                check_server(url, timeout_s=1.0)
            except OpenEnvServerError:
                return
            time.sleep(0.5)
        pytest.fail(f"the environment server at {url} is still up after its parent was killed")
    finally:
        if proc.poll() is None:
            proc.kill()
