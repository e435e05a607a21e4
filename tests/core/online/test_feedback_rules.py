"""The rules of feedback that timing must not change: a client's rating beats a judge's score in
either order (the judge taking its time while the client rates included), and feedback ids are
unique across the run (a conflicting reuse is a 409 naming the first use, an identical repeat is
idempotent), before and after a restart."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agentbolt import semconv
from agentbolt.lightningrl import LightningRL, LightningRLConfig
from agentbolt.online import JudgeOptions, OnlineServer, SessionOptions
from agentbolt.rewards import LLMJudge, Trajectory
from agentbolt.rewards.judge import JudgeScore
from agentbolt.testing.fake_llm import FakeLLM, FakeLLMServer

from .helpers import TOKEN, db, openai_client, post_feedback, reward_spans


class HeldJudge(LLMJudge):
    """A judge that answers 1.0 once released: the test decides how long it thinks (an 8 s judge
    without the 8 s)."""

    def __init__(self) -> None:
        super().__init__("http://127.0.0.1:9/v1", "held-judge")
        self.thinking = asyncio.Event()
        self.release = asyncio.Event()

    async def score(self, trajectory: Trajectory, *, reference: str | None = None) -> JudgeScore | None:
        self.thinking.set()
        await self.release.wait()
        return JudgeScore(reward=1.0, reason="looks right to the judge")


def _server(tmp_path: Path, upstream: str, judge: LLMJudge | None = None) -> OnlineServer:
    return OnlineServer(
        db(tmp_path),
        upstream,
        state_dir=tmp_path / "state",
        token=TOKEN,
        sessions=SessionOptions(idle_s=60),
        judge=None if judge is None else JudgeOptions(judge=judge, after_s=0, every_s=0.02, max_tries=1),
        metrics_every_s=3600,
    )


async def _session(server: OnlineServer, key: str) -> str:
    client = openai_client(server, **{"X-Agentbolt-Session-Id": key})
    await client.chat.completions.create(model="any", messages=[{"role": "user", "content": "Capital of France?"}])
    return server.sessions.current[key].rollout_id


async def _trained_return(server: OnlineServer, rollout_id: str) -> float | None:
    """The episode return LightningRL trains the session with."""
    await server.gateway.flush()
    rollout = (await server.store.get_rollouts([rollout_id]))[0]
    spans = (await server.store.query_spans([rollout_id], latest_attempt_only=True))[rollout_id]
    batch = LightningRL(LightningRLConfig(allow_empty=True)).process([rollout], spans)
    assert len(batch.episodes) == 1
    return batch.episodes[0].final_reward


async def _until(condition, timeout_s: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    for _ in range(int(timeout_s / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


@pytest.mark.parametrize("order", ["client_rates_while_the_judge_thinks", "judge_first", "client_first"])
async def test_the_clients_rating_beats_the_judges_score_in_any_order(tmp_path: Path, order: str) -> None:
    judge = HeldJudge()
    async with (
        FakeLLMServer(FakeLLM(default_reply="Paris.")) as upstream,
        _server(tmp_path, upstream.base_url, judge) as server,
    ):
        assert server.judge is not None
        rollout_id = await _session(server, "chat")
        rating = {"feedback_id": "user-rating", "session_id": "chat", "reward": 0.0}
        if order == "client_first":
            assert (await post_feedback(server, rating)).json()["status"] == "recorded"
        await server.sessions.close("chat")
        if order == "client_rates_while_the_judge_thinks":
            await _until(judge.thinking.is_set)  # the judge has the session and is thinking
            answer = await post_feedback(server, rating)
            assert answer.status_code == 200 and answer.json()["status"] == "recorded"
            judge.release.set()
            await _until(lambda: server.judge is not None and server.judge.superseded == 1)
        elif order == "judge_first":
            judge.release.set()
            await _until(lambda: server.judge is not None and server.judge.judged == 1)
            answer = await post_feedback(server, rating)
            assert answer.status_code == 200 and answer.json()["status"] == "recorded"
        else:  # rated before it closed: never pending, never judged
            judge.release.set()
            await asyncio.sleep(0.1)
            assert not judge.thinking.is_set()
        assert await _trained_return(server, rollout_id) == 0.0
        sources = [s.attributes[semconv.FEEDBACK_SOURCE] for s in await reward_spans(server, rollout_id)]
        assert sources == (["judge", "client"] if order == "judge_first" else ["client"])
        session = server.sessions.by_rollout[rollout_id]
        assert session.has_final and not session.judged


async def test_the_store_refuses_a_judge_score_that_lost_the_race(tmp_path: Path) -> None:
    """The judge's re-check and the store's rule together: a score written after the client's
    rating, however it got past the re-check, is refused by the store."""
    judge = HeldJudge()
    async with FakeLLMServer(FakeLLM()) as upstream, _server(tmp_path, upstream.base_url, judge) as server:
        assert server.judge is not None
        rollout_id = await _session(server, "raced")
        await server.sessions.close("raced")
        await _until(judge.thinking.is_set)
        await post_feedback(server, {"feedback_id": "r", "session_id": "raced", "reward": -1.0})
        server.sessions.by_rollout[rollout_id].has_final = False  # hide the rating from the in-memory re-check
        server.judge._rated = _nothing  # type: ignore[method-assign]  # ... and from the store re-check
        judge.release.set()
        await _until(lambda: server.judge is not None and server.judge.superseded == 1)
        assert [s.attributes[semconv.FEEDBACK_SOURCE] for s in await reward_spans(server, rollout_id)] == ["client"]
        assert await _trained_return(server, rollout_id) == -1.0


async def _nothing(rollout_ids: object) -> set[str]:
    return set()


async def test_feedback_ids_are_unique_across_the_run(tmp_path: Path) -> None:
    async with FakeLLMServer(FakeLLM()) as upstream:
        server = _server(tmp_path, upstream.base_url)
        await server.start()
        try:
            first = await _session(server, "alice")
            second = await _session(server, "bob")
            body = {"feedback_id": "fb-1", "session_id": "alice", "reward": 1.0}
            assert (await post_feedback(server, body)).json()["status"] == "recorded"
            assert (await post_feedback(server, body)).json()["status"] == "duplicate"  # identical: idempotent
            reused = await post_feedback(server, {**body, "session_id": "bob"})
            assert reused.status_code == 409, reused.text
            message = reused.json()["error"]["message"]
            assert "'fb-1'" in message and "session 'alice'" in message and "first used at" in message
            assert await reward_spans(server, second) == []
            assert len(await reward_spans(server, first)) == 1
        finally:
            await server.stop()

        again = _server(tmp_path, upstream.base_url)  # the rule holds across a restart
        await again.start()
        try:
            await _session(again, "carol")
            reused = await post_feedback(again, {"feedback_id": "fb-1", "session_id": "carol", "reward": 1.0})
            assert reused.status_code == 409 and "session 'alice'" in reused.json()["error"]["message"]
            repeat = await post_feedback(again, {"feedback_id": "fb-1", "session_id": "alice", "reward": 1.0})
            assert repeat.status_code == 200 and repeat.json()["status"] == "duplicate"
        finally:
            await again.stop()


async def test_concurrent_reuses_of_one_id_record_it_once(tmp_path: Path) -> None:
    async with FakeLLMServer(FakeLLM()) as upstream, _server(tmp_path, upstream.base_url) as server:
        keys = [f"s{i}" for i in range(6)]
        rollouts = [await _session(server, k) for k in keys]
        answers = await asyncio.gather(
            *(post_feedback(server, {"feedback_id": "same", "session_id": k, "reward": 0.5}) for k in keys)
        )
        assert sorted(a.status_code for a in answers) == [200] + [409] * 5
        stored = [len(await reward_spans(server, r)) for r in rollouts]
        assert sum(stored) == 1
