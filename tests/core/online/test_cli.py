"""The ``agentbolt serve`` command: a real process in front of the fake LLM, a real SQLite store;
feedback before and after the process is restarted lands on the same session, nothing is lost."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from agentbolt.testing.fake_llm import FakeLLM, FakeLLMServer

TOKEN = "cli-s3cret"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(tmp_path: Path, upstream: str, port: int) -> subprocess.Popen[str]:
    args = [sys.executable, "-m", "agentbolt.cli", "serve", "--upstream", upstream, "--port", str(port)]
    args += ["--store", f"sqlite:///{tmp_path / 'serve.db'}", "--state-dir", str(tmp_path / "state"), "--idle", "600"]
    env = {**os.environ, "AGENTBOLT_SERVE_TOKEN": TOKEN}
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _wait_ready(proc: subprocess.Popen[str], url: str) -> None:
    for _ in range(600):
        if proc.poll() is not None:
            pytest.fail(f"agentbolt serve exited {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}")
        try:
            if httpx.get(f"{url}/ready", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    pytest.fail("agentbolt serve did not come up")


def _stop(proc: subprocess.Popen[str]) -> str:
    if proc.poll() is not None:
        return proc.stderr.read() if proc.stderr else ""
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return err


def test_feedback_before_and_after_a_restart_of_agentbolt_serve(tmp_path: Path) -> None:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    auth = {"authorization": f"Bearer {TOKEN}"}
    with FakeLLMServer(FakeLLM(default_reply="Paris.")) as upstream:
        proc = _start(tmp_path, upstream.base_url, port)
        try:
            _wait_ready(proc, url)
            chat = {"model": "any", "messages": [{"role": "user", "content": "Capital of France?"}]}
            first = httpx.post(
                f"{url}/v1/chat/completions", json=chat, headers={**auth, "x-agentbolt-session-id": "c1"}
            )
            assert first.status_code == 200 and first.headers["x-agentbolt-session-id"] == "c1"
            early = {"feedback_id": "early", "response_id": first.json()["id"], "reward": 0.5}
            assert httpx.post(f"{url}/v1/feedback", json=early, headers=auth).json()["status"] == "recorded"
        finally:
            err = _stop(proc)
        assert "agentbolt serve on" in err

        proc = _start(tmp_path, upstream.base_url, port)
        try:
            _wait_ready(proc, url)
            again = httpx.post(
                f"{url}/v1/chat/completions", json=chat, headers={**auth, "x-agentbolt-session-id": "c1"}
            )
            assert again.status_code == 200
            late = {"feedback_id": "late", "session_id": "c1", "reward": 1.0}
            assert httpx.post(f"{url}/v1/feedback", json=late, headers=auth).json()["status"] == "recorded"
            repeat = httpx.post(f"{url}/v1/feedback", json=early, headers=auth)  # the client retries the old one
            assert repeat.json()["status"] == "duplicate"
            status = httpx.get(f"{url}/v1/online/status", headers=auth).json()
            # the run's counters, read back from the store: one session (resumed, not reopened), two
            # calls, two feedbacks
            assert status["sessions"]["sessions_opened"] == 1 and status["sessions"]["calls"] == 2
            assert status["feedback"]["client"] == 2
            assert httpx.get(f"{url}/v1/online/status").status_code == 401
        finally:
            _stop(proc)

    # what is in the store, read with plain SQL: one session rollout, one attempt, two calls, two rewards
    with sqlite3.connect(tmp_path / "serve.db") as db:
        rollouts = db.execute("SELECT id, rollout_id, metadata FROM rollouts").fetchall()
        sessions = [r for r in rollouts if json.loads(r[2]).get("agentbolt.session.id") == "c1"]
        assert len(sessions) == 1
        key, rollout_id, _ = sessions[0]
        attempts = db.execute("SELECT COUNT(*) FROM attempts WHERE rollout_id = ?", (rollout_id,)).fetchone()[0]
        names = [json.loads(b)["name"] for (b,) in db.execute("SELECT body FROM spans WHERE rkey = ?", (key,))]
    assert attempts == 1
    assert sorted(n for n in names if n == "agentbolt.reward") == ["agentbolt.reward"] * 2
    assert len([n for n in names if n != "agentbolt.reward"]) == 2
