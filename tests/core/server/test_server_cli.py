"""``agentbolt store serve``: refuses unsafe binds, serves, shuts down cleanly on Ctrl+C."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from agentbolt import types as t
from agentbolt.cli import app
from agentbolt.store import open_store


def test_serve_refuses_a_public_address_without_a_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENTBOLT_STORE_TOKEN", raising=False)
    result = CliRunner().invoke(app, ["store", "serve", "--store", "memory://", "--host", "0.0.0.0", "--port", "0"])
    assert result.exit_code == 2
    assert "without a token" in result.output and "--token" in result.output


def test_serve_command_serves_until_interrupted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "runs.db"
    env = {**os.environ, "AGENTBOLT_STORE_TOKEN": "s3cret"}
    command = [sys.executable, "-m", "agentbolt.cli", "store", "serve", "--store", f"sqlite:///{db}", "--port", "0"]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
    lines: list[str] = []
    found = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if "listening on" in line:
                found.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert found.wait(60), "".join(lines)
        url = re.search(r"listening on (http://127\.0\.0\.1:\d+)", "".join(lines)).group(1)  # type: ignore[union-attr]
        assert httpx.get(url + "/v1/rollouts/counts").status_code == 401
        assert "/v1/traces" in httpx.get(url + "/openapi.json").json()["paths"]

        async def work() -> None:
            store = open_store(url)  # the token comes from AGENTBOLT_STORE_TOKEN
            await store.enqueue([t.RolloutSpec(rollout_id="r0", input="2+2")])
            (claim,) = await store.dequeue("w")
            await store.add_spans([t.Span.create("chat", rollout_id="r0", attempt_id=claim.attempt.attempt_id)])
            await store.finish_attempt(claim.attempt.attempt_id, t.AttemptStatus.SUCCEEDED, reward=1.0)
            await store.close()

        monkeypatch.setenv("AGENTBOLT_STORE_TOKEN", "s3cret")
        asyncio.run(work())
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(30)
        reader.join(5)
    assert code == 0, "".join(lines)
    assert "stopped" in "".join(lines) and "Traceback" not in "".join(lines)

    async def check() -> None:  # everything the server acknowledged is in the file
        store = open_store(f"sqlite:///{db}", sweep_interval_s=0)
        (rollout,) = await store.get_rollouts(["r0"])
        assert rollout.status is t.RolloutStatus.SUCCEEDED and rollout.final_reward == 1.0
        assert len((await store.query_spans(["r0"]))["r0"]) == 1
        await store.close()

    asyncio.run(check())
