"""What a restart of agentbolt serve keeps and says: readiness only once the policy serves, the
run's counters rebuilt from the store, and sessions whose call the stop cut end ``aborted``
(the real kill -9 test is tests/core/online/test_serve_crash.py)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import httpx

from agentbolt import types as t
from agentbolt.gateway import Upstream
from agentbolt.online import OnlineServer, SessionOptions
from agentbolt.online.policy import StaticPolicy
from agentbolt.testing.fake_llm import FakeLLM, FakeLLMServer

from .helpers import TOKEN, db, openai_client, post_feedback


class SlowStartPolicy(StaticPolicy):
    """A fixed upstream whose start takes until the test releases it (a model loading)."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.loaded = threading.Event()

    def start(self, version: int, checkpoint: Path | None) -> Upstream:
        assert self.loaded.wait(60)
        return super().start(version, checkpoint)


def _server(tmp_path: Path, policy: StaticPolicy | str) -> OnlineServer:
    return OnlineServer(
        db(tmp_path),
        policy,
        state_dir=tmp_path / "state",
        token=TOKEN,
        sessions=SessionOptions(idle_s=60),
        metrics_every_s=3600,
    )


async def test_ready_only_once_the_policy_serves(tmp_path: Path) -> None:
    async with FakeLLMServer(FakeLLM()) as upstream:
        policy = SlowStartPolicy(upstream.base_url)
        server = _server(tmp_path, policy)
        starting = asyncio.create_task(server.start())
        while server.gateway is None or not server.gateway.port:
            await asyncio.sleep(0.01)
        async with httpx.AsyncClient(base_url=server.gateway.url) as http:
            not_yet = await http.get("/ready")
            assert not_yet.status_code == 503 and "starting" in not_yet.json()["reason"]
            health = await http.get("/gateway/health")  # alive, not ready
            assert health.status_code == 200 and health.json()["ready"] is False
            policy.loaded.set()
            await starting
            try:
                ready = await http.get("/ready")
                assert ready.status_code == 200 and ready.json() == {"status": "ready"}
                assert (await http.get("/gateway/health")).json()["ready"] is True
            finally:
                await server.stop()


async def test_status_counters_are_the_runs_and_survive_a_restart(tmp_path: Path) -> None:
    async with FakeLLMServer(FakeLLM()) as upstream:
        server = _server(tmp_path, upstream.base_url)
        await server.start()
        try:
            for i in range(3):
                client = openai_client(server, **{"X-Agentbolt-Session-Id": f"s{i}"})
                await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
                await post_feedback(server, {"feedback_id": f"f{i}", "session_id": f"s{i}", "reward": 1.0})
            await server.sessions.close("s0")
            before = server.status()
        finally:
            await server.stop()
        assert before["sessions"]["calls"] == 3 and before["feedback"]["client"] == 3

        again = _server(tmp_path, upstream.base_url)
        await again.start()
        try:
            after = again.status()
            assert after["sessions"]["calls"] == 3 and after["feedback"]["client"] == 3
            assert after["sessions"]["sessions_opened"] == 3 and after["sessions"]["sessions_closed"] == 1
            assert after["metrics"]["online/calls"] == 3.0
        finally:
            await again.stop()


async def test_a_session_whose_call_the_stop_cut_ends_aborted(tmp_path: Path) -> None:
    async with FakeLLMServer(FakeLLM()) as upstream:
        server = _server(tmp_path, upstream.base_url)
        await server.start()
        try:
            for key in ("cut", "calm"):
                client = openai_client(server, **{"X-Agentbolt-Session-Id": key})
                await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
            cut, calm = server.sessions.current["cut"], server.sessions.current["calm"]
            # a call of "cut" starts, and the process dies before it ends (what a kill -9 leaves)
            assert server.sessions.journal is not None
            server.sessions.journal.started(cut.rollout_id)
        finally:
            await server.stop()

        again = _server(tmp_path, upstream.base_url)
        await again.start()
        try:
            (aborted,) = await again.store.get_rollouts([cut.rollout_id])
            assert aborted.status is t.RolloutStatus.FAILED
            assert aborted.error is not None and aborted.error.type == "aborted"
            assert again.sessions.by_rollout[cut.rollout_id].closed
            assert not again.sessions.by_rollout[calm.rollout_id].closed  # resumed, as before
            assert again.status()["sessions"]["sessions_aborted"] == 1
            # the aborted session's complete call is kept; the same key opens a new segment
            client = openai_client(again, **{"X-Agentbolt-Session-Id": "cut"})
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "again"}])
            assert again.sessions.current["cut"].segment == 1
        finally:
            await again.stop()
