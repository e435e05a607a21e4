"""POST /v1/feedback: rewards on sessions and responses, idempotent, validated, authenticated, and
kept across a restart of agentbolt serve (sessions resume, feedback lands on them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.lightningrl import LightningRL, LightningRLConfig
from agentbolt.online import OnlineServer, SessionOptions
from agentbolt.testing.fake_llm import FakeLLM, FakeLLMServer

from .helpers import TOKEN, db, openai_client, post_feedback, reward_spans


def _server(tmp_path: Path, upstream: str, *, idle_s: float = 30.0) -> OnlineServer:
    return OnlineServer(
        db(tmp_path),
        upstream,
        state_dir=tmp_path / "state",
        token=TOKEN,
        sessions=SessionOptions(idle_s=idle_s),
        metrics_every_s=60,
    )


async def _chat(server: OnlineServer, session: str, text: str) -> str:
    client = openai_client(server, **{"X-Agentbolt-Session-Id": session})
    answer = await client.chat.completions.create(model="any", messages=[{"role": "user", "content": text}])
    return answer.id


async def test_feedback_on_a_session_and_on_a_response_become_the_rewards_lightningrl_reads(tmp_path: Path) -> None:
    async with FakeLLMServer(FakeLLM(default_reply="four")) as upstream, _server(tmp_path, upstream.base_url) as server:
        first = await _chat(server, "s1", "2+2?")
        await _chat(server, "s1", "and 3+1?")
        ok = await post_feedback(server, {"feedback_id": "f1", "response_id": first, "reward": -0.5})
        assert ok.status_code == 200 and ok.json()["status"] == "recorded" and ok.json()["session_id"] == "s1"
        ok = await post_feedback(
            server, {"feedback_id": "f2", "session_id": "s1", "reward": 1.0, "dimensions": {"polite": 0.5}}
        )
        assert ok.status_code == 200
        session = server.sessions.current["s1"]
        assert session.has_final and session.rewards == 2
        await server.sessions.close("s1")
        await server.gateway.flush()
        rollout = (await server.store.get_rollouts([session.rollout_id]))[0]
        spans = (await server.store.query_spans([rollout.rollout_id], latest_attempt_only=True))[rollout.rollout_id]
        batch = LightningRL(LightningRLConfig(credit="intermediate", allow_empty=True)).process([rollout], spans)
        # the session reward is the return of both calls; the response feedback is the first call's own reward
        assert [round(tr.reward, 6) for tr in batch.transitions] == [0.5, 1.0]


async def test_duplicate_feedback_is_idempotent_and_a_reused_id_with_other_content_is_refused(tmp_path: Path) -> None:
    async with FakeLLMServer(FakeLLM()) as upstream, _server(tmp_path, upstream.base_url) as server:
        await _chat(server, "s2", "hi")
        body = {"feedback_id": "dup", "session_id": "s2", "reward": 1.0}
        first = await post_feedback(server, body)
        again = await post_feedback(server, body)
        assert first.json()["status"] == "recorded" and again.json()["status"] == "duplicate"
        changed = await post_feedback(server, {**body, "reward": 0.0})
        assert changed.status_code == 409 and "other content" in changed.json()["error"]["message"]
        rewards = await reward_spans(server, server.sessions.current["s2"].rollout_id)
        assert len(rewards) == 1 and rewards[0].attributes[semconv.REWARD_VALUE] == 1.0
        assert server.feedback_count == {"client": 1, "duplicate": 1}


async def test_bad_feedback_gets_a_clear_4xx_and_changes_nothing(tmp_path: Path) -> None:
    async with FakeLLMServer(FakeLLM()) as upstream, _server(tmp_path, upstream.base_url) as server:
        await _chat(server, "s3", "hi")
        rollout_id = server.sessions.current["s3"].rollout_id
        cases = {
            "unknown session": ({"feedback_id": "a", "session_id": "nope", "reward": 1}, 404, "unknown session"),
            "unknown response": (
                {"feedback_id": "b", "response_id": "chatcmpl-x", "reward": 1},
                404,
                "unknown response",
            ),
            "NaN": ('{"feedback_id": "c", "session_id": "s3", "reward": NaN}', 422, "reward"),
            "infinite": ('{"feedback_id": "c", "session_id": "s3", "reward": 1e999}', 422, "reward"),
            "no target": ({"feedback_id": "d", "reward": 1}, 422, "exactly one of session_id or response_id"),
            "two targets": (
                {"feedback_id": "e", "session_id": "s3", "response_id": "r", "reward": 1},
                422,
                "exactly one",
            ),
            "no id": ({"session_id": "s3", "reward": 1}, 422, "feedback_id"),
            "string reward": ({"feedback_id": "f", "session_id": "s3", "reward": "good"}, 422, "reward"),
            "NaN dimension": (
                '{"feedback_id": "g", "session_id": "s3", "reward": 1, "dimensions": {"x": NaN}}',
                422,
                "dimensions",
            ),
            "not json": ("{not json", 422, "invalid"),
        }
        for name, (body, status, message) in cases.items():
            answer = await post_feedback(server, body)
            assert answer.status_code == status, (name, answer.text)
            assert message in answer.json()["error"]["message"], (name, answer.text)
        wrong_token = await post_feedback(server, {"feedback_id": "h", "session_id": "s3", "reward": 1}, token="bad")
        no_token = await post_feedback(server, {"feedback_id": "h", "session_id": "s3", "reward": 1}, token=None)
        assert wrong_token.status_code == 401 and no_token.status_code == 401
        assert await reward_spans(server, rollout_id) == []  # nothing changed
        assert not server.sessions.current["s3"].has_final


async def test_sessions_and_feedback_survive_a_restart(tmp_path: Path) -> None:
    async with FakeLLMServer(FakeLLM(default_reply="ok")) as upstream:
        server = _server(tmp_path, upstream.base_url)
        await server.start()
        early = await _chat(server, "long", "first turn")
        before = await post_feedback(server, {"feedback_id": "pre", "response_id": early, "reward": 0.25})
        assert before.status_code == 200
        run_id, rollout_id = server.run_id, server.sessions.current["long"].rollout_id
        await server.stop()

        again = _server(tmp_path, upstream.base_url)
        await again.start()
        try:
            assert again.run_id == run_id
            session = again.sessions.current["long"]
            assert session.rollout_id == rollout_id and not session.closed and session.rewards == 1
            await _chat(again, "long", "second turn")  # the same session, the same attempt
            assert again.sessions.current["long"].rollout_id == rollout_id
            after = await post_feedback(again, {"feedback_id": "post", "session_id": "long", "reward": 1.0})
            repeat = await post_feedback(again, {"feedback_id": "pre", "response_id": early, "reward": 0.25})
            assert after.json()["status"] == "recorded" and repeat.json()["status"] == "duplicate"
            await again.gateway.flush()
            spans = (await again.store.query_spans([rollout_id]))[rollout_id]
            calls = [s for s in spans if s.attributes.get(semconv.SPAN_KIND_ATTR) == semconv.KIND_LLM]
            rewards = [s for s in spans if s.attributes.get(semconv.SPAN_KIND_ATTR) == semconv.KIND_REWARD]
            assert len(calls) == 2 and len({s.attempt_id for s in spans}) == 1
            assert sorted(json.loads(r.attributes[semconv.REWARD_DIMENSIONS])["reward"] for r in rewards) == [0.25, 1.0]
            rollout = (await again.store.get_rollouts([rollout_id]))[0]
            assert rollout.status is t.RolloutStatus.RUNNING and rollout.attempt_count == 1
        finally:
            await again.stop()


def test_served_and_traced_feedback_record_the_same_reward() -> None:
    """A served session's feedback and a traced rollout's record one reward span shape (one
    builder, agentbolt.reward_spans): the same attributes for the same content; only the span id
    namespaces differ, each stable across retries."""
    from agentbolt.online.feedback import reward_span as served_span
    from agentbolt.online.feedback import span_id_for
    from agentbolt.online.sessions import Session
    from agentbolt.traces.rewards import reward_span as traced_span

    for final, dims in ((True, None), (False, {"helpful": 0.0, "reward": 9.0})):
        content: dict[str, Any] = {
            "reward": -1.5,
            "source": "client",
            "final": final,
            "dimensions": dims,
            "comment": "meh",
        }
        served = served_span(Session("k", "r1", "a1", 0), feedback_id="fb-1", fingerprint="f", **content)
        traced = traced_span("r1", "a1", reward_id="fb-1", fingerprint="f", **content)
        assert served.attributes == traced.attributes and served.name == traced.name == semconv.SPAN_REWARD
        assert json.loads(served.attributes[semconv.REWARD_DIMENSIONS]) == {**(dims or {}), "reward": -1.5}
        assert served.span_id == span_id_for("fb-1") != traced.span_id
        assert traced.span_id == traced_span("r1", "a1", reward_id="fb-1", **content).span_id
