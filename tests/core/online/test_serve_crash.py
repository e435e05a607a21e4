"""kill -9 of ``agentbolt serve`` at random moments under 16 streaming clients, many times.

The real server process (``python -m agentbolt.cli serve``, SQLite store) in front of the fake
LLM (a process of its own, streaming token by token); 16 clients stream chat completions (half
in named sessions, half keyless), rate some answers, and retry through the crashes. After every
kill the server is restarted on the same port and the clients go on. At the end:

- every call a client received in full (its stream reached ``data: [DONE]``) is in the store,
  once;
- every feedback the server acknowledged (200) is in the store exactly once;
- no session is left ``running``: the sessions whose stream a kill cut end ``aborted`` on
  restart, the others close as usual.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import orjson
import pytest

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.store import RolloutSearch, open_store
from agentbolt.testing.fake_llm import FakeLLM, FakeLLMProcess

pytestmark = pytest.mark.slow

TOKEN = "crash-s3cret"
CLIENTS = 16
KILLS = 20
IDLE_S = 1.0
REPLY = " ".join(f"word{i}" for i in range(24))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Serve:
    """The ``agentbolt serve`` process, killed and restarted on the same port."""

    def __init__(self, tmp_path: Path, upstream: str) -> None:
        self.tmp_path = tmp_path
        self.upstream = upstream
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = (tmp_path / "serve.log").open("ab")

    def start(self) -> None:
        args = [sys.executable, "-m", "agentbolt.cli", "serve", "--upstream", self.upstream]
        args += ["--port", str(self.port), "--store", f"sqlite:///{self.tmp_path / 'serve.db'}"]
        args += ["--state-dir", str(self.tmp_path / "state"), "--idle", str(IDLE_S)]
        env = {**os.environ, "AGENTBOLT_SERVE_TOKEN": TOKEN}
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=self.log, env=env)

    async def ready(self, http: httpx.AsyncClient) -> None:
        for _ in range(1200):
            assert self.proc is not None
            if self.proc.poll() is not None:  # e.g. the port not yet free: start again
                await asyncio.sleep(0.2)
                self.start()
                continue
            with contextlib.suppress(httpx.HTTPError):
                if (await http.get(f"{self.url}/ready", timeout=2)).status_code == 200:
                    return
            await asyncio.sleep(0.1)
        raise AssertionError(f"agentbolt serve did not come up; see {self.tmp_path / 'serve.log'}")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(60)
        self.log.close()


class Clients:
    """What the clients saw: answers received in full, feedback acknowledged."""

    def __init__(self, serve: Serve) -> None:
        self.serve = serve
        self.received: list[str] = []
        self.acknowledged: dict[str, str] = {}
        self.failures = 0
        """Calls that got no full answer (a stream cut by a kill, or the server down)."""
        self.rng = random.Random(7)

    async def client(self, k: int, http: httpx.AsyncClient) -> None:
        auth = {"authorization": f"Bearer {TOKEN}"}
        n = 0
        while True:
            n += 1
            headers = dict(auth)
            if k % 2 == 0:
                headers["x-agentbolt-session-id"] = f"c{k}-{n // 3}"  # a session of three calls
            body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": f"client {k} call {n}"}]}
            data = b""
            try:
                async with http.stream(
                    "POST", f"{self.serve.url}/v1/chat/completions", json=body, headers=headers
                ) as r:
                    if r.status_code != 200:
                        await asyncio.sleep(0.05)
                        continue
                    async for chunk in r.aiter_bytes():
                        data += chunk
            except httpx.HTTPError:
                self.failures += 1
                await asyncio.sleep(0.2)
                continue
            if b"data: [DONE]" not in data:
                self.failures += 1
                continue
            first = next(line for line in data.split(b"\n") if line.startswith(b"data: {"))
            response_id = orjson.loads(first[6:])["id"]
            self.received.append(response_id)
            if self.rng.random() < 0.5:
                await self.rate(http, response_id, auth)

    async def rate(self, http: httpx.AsyncClient, response_id: str, auth: dict[str, str]) -> None:
        feedback_id = f"fb-{response_id}"
        body = {"feedback_id": feedback_id, "response_id": response_id, "reward": self.rng.random()}
        for _ in range(100):  # retried through crashes with the same id (idempotent)
            try:
                answer = await http.post(f"{self.serve.url}/v1/feedback", json=body, headers=auth)
            except httpx.HTTPError:
                await asyncio.sleep(0.2)
                continue
            if answer.status_code == 200:
                self.acknowledged[feedback_id] = response_id
                return
            assert answer.status_code in (502, 503), answer.text
            await asyncio.sleep(0.2)


@pytest.mark.timeout(900)  # 20 restarts of a Python process: about 5 s each, minutes on a busy 2-core machine
async def test_kill_9_at_random_moments_loses_no_answered_call_or_acknowledged_feedback(tmp_path: Path) -> None:
    rng = random.Random(11)
    backend = FakeLLM(default_reply=REPLY, token_latency_s=0.01, record=False)
    with FakeLLMProcess(backend) as upstream:
        serve = Serve(tmp_path, upstream.base_url)
        serve.start()
        limits = httpx.Limits(max_connections=64)
        async with httpx.AsyncClient(timeout=httpx.Timeout(30.0), limits=limits) as http:
            await serve.ready(http)
            clients = Clients(serve)
            tasks = [asyncio.create_task(clients.client(k, http)) for k in range(CLIENTS)]
            try:
                for _ in range(KILLS):
                    done = len(clients.received)
                    await asyncio.sleep(rng.uniform(0.2, 1.0))
                    while len(clients.received) == done:  # kill while traffic flows
                        await asyncio.sleep(0.05)
                    serve.kill()
                    serve.start()
                    await serve.ready(http)
                await asyncio.sleep(0.5)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.sleep(IDLE_S * 4)  # the live sessions close as idle
            try:
                await _check(tmp_path, clients)
            finally:
                serve.stop()


async def _check(tmp_path: Path, clients: Clients) -> None:
    assert len(clients.received) > 100 and clients.acknowledged and clients.failures >= KILLS
    # half the received answers are rated (each retried until acknowledged): far more than a quarter
    # acknowledged, or the feedback check below proves little
    assert len(clients.acknowledged) * 4 >= len(clients.received), (len(clients.acknowledged), len(clients.received))
    run_id = json.loads((tmp_path / "state" / "ledger.jsonl").read_text().splitlines()[0])["run_id"]
    store = open_store(f"sqlite:///{tmp_path / 'serve.db'}")
    try:
        rollouts: list[t.Rollout] = []
        while True:
            page = await store.search_rollouts(RolloutSearch(run_id=run_id, limit=1000, offset=len(rollouts)))
            rollouts += page.items
            if not page.items or len(rollouts) >= page.total:
                break
        calls: Counter[str] = Counter()
        feedback: Counter[str] = Counter()
        ids = [r.rollout_id for r in rollouts]
        for i in range(0, len(ids), 200):
            for spans in (await store.query_spans(ids[i : i + 200])).values():
                for span in spans:
                    attrs = span.attributes
                    if attrs.get(semconv.SPAN_KIND_ATTR) == semconv.KIND_LLM and semconv.GEN_AI_RESPONSE_ID in attrs:
                        calls[str(attrs[semconv.GEN_AI_RESPONSE_ID])] += 1
                    if semconv.FEEDBACK_ID in attrs:
                        feedback[str(attrs[semconv.FEEDBACK_ID])] += 1
    finally:
        await store.close()
    missing = [r for r in clients.received if calls[r] != 1]
    assert not missing, f"{len(missing)} of {len(clients.received)} answered calls not stored once: {missing[:5]}"
    wrong = {f: feedback[f] for f in clients.acknowledged if feedback[f] != 1}
    assert not wrong, f"acknowledged feedback not stored exactly once: {wrong}"
    running = [r.rollout_id for r in rollouts if r.status is t.RolloutStatus.RUNNING]
    assert not running, f"sessions left running: {running[:5]}"
    aborted = [r for r in rollouts if r.error is not None and r.error.type == "aborted"]
    assert aborted, "no session was aborted, yet every kill cut streams"
    print(
        f"{KILLS} kills: {len(clients.received)} calls received in full, all stored once; "
        f"{len(clients.acknowledged)} feedback acknowledged, each stored once; {clients.failures} calls without a full answer (cut or server down); "
        f"{len(aborted)} sessions aborted, none left running ({time.strftime('%H:%M:%S')})"
    )
