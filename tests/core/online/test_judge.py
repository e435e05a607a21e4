"""Judges as reward functions: the parsing of rubric and ranking answers, malformed answers counted
(never raised), retries, the cache and the cost counter, against a scripted OpenAI-compatible judge;
the same judge scoring the sessions nobody rated in agentbolt serve, and as an offline reward."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.online import JudgeOptions, OnlineServer, SessionOptions, keys
from agentbolt.rewards import LLMJudge, MalformedJudgement, Trajectory, judged
from agentbolt.rewards.prompts import parse_ranking, parse_rubric
from agentbolt.rewards.trajectory import readable_text
from agentbolt.testing.fake_llm import Failure, FakeLLM, FakeLLMServer
from agentbolt.testing.scripted_judge import ScriptedJudge

from .helpers import TOKEN, db, openai_client, reward_spans

PARIS = Trajectory.of_text("What is the capital of France?", "Paris.")
LYON = Trajectory.of_text("What is the capital of France?", "Lyon.")


@pytest.mark.parametrize(
    ("text", "reward"),
    [
        ('{"score": 7, "reason": "fine"}', 0.7),
        ('Looking at it...\n```json\n{"score": 10, "reason": "right"}\n```', 1.0),
        ("Reasoning first.\nscore: 3", 0.3),
        ('{"score": "8", "reason": "a string number is read"}', 0.8),
    ],
)
def test_rubric_answers_are_read_leniently_in_form(text: str, reward: float) -> None:
    assert parse_rubric(text).reward == pytest.approx(reward)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "nothing"),
        ("It is quite good.", "no score"),
        ('{"score": 11}', "outside 0-10"),
        ('{"score": -1}', "outside 0-10"),
        ('{"score": NaN}', "no score"),
        ('{"score": true}', "boolean"),
        ('{"score": "high"}', "not a number"),
    ],
)
def test_malformed_rubric_answers_raise_a_clear_malformed_judgement(text: str, why: str) -> None:
    with pytest.raises(MalformedJudgement, match=why):
        parse_rubric(text)


def test_ranking_answers_are_strict_in_content() -> None:
    good = '{"scores": [{"id": 2, "score": 0.2, "reason": "b"}, {"id": 1, "score": 0.9, "reason": "a"}]}'
    assert [s.reward for s in parse_ranking(good, 2)] == [0.9, 0.2]  # attempt order, whatever the answer's
    bad = {
        '{"scores": [{"id": 1, "score": 0.9}]}': "have no score",
        '{"scores": [{"id": 1, "score": 0.9}, {"id": 1, "score": 0.1}]}': "scored twice",
        '{"scores": [{"id": 1, "score": 0.9}, {"id": 3, "score": 0.1}]}': "names no attempt",
        '{"scores": [{"id": 1, "score": 1.5}, {"id": 2, "score": 0.1}]}': "outside 0-1",
        "[0.9, 0.1]": "no",
        '{"scores": [{"score": 0.9}, {"id": 2, "score": 0.1}]}': "without id",
    }
    for text, why in bad.items():
        with pytest.raises(MalformedJudgement, match=why):
            parse_ranking(text, 2)


def test_judges_and_prompt_keys_read_message_content_alike() -> None:
    parts = [
        {"type": "text", "text": "What is in"},
        {"type": "image_url", "image_url": {"url": "data:..."}},
        "this picture?",
        {"type": "input_audio"},
    ]
    assert readable_text(parts) == "What is in\n[image]\nthis picture?"
    assert readable_text(None) == "" and readable_text("hi") == "hi" and readable_text({"a": 1}) == '{"a":1}'
    # The judge's transcript and a live session's question read the same text.
    assert Trajectory([{"role": "user", "content": parts}]).task_text() == readable_text(parts)
    body = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": parts}]}
    assert keys.prompt_text(body) == readable_text(parts)
    assert keys.prompt_key(keys.prompt_text(body)) == keys.prompt_key("what is in [image] THIS picture?")


async def test_malformed_answers_are_counted_retried_and_never_raised() -> None:
    script = ScriptedJudge(raw=["I think it is fine.", '{"score": 42}', '{"score": 9, "reason": "ok"}'])
    async with FakeLLMServer(script.fake_llm()) as server:
        judge = LLMJudge(server.base_url, "judge", max_retries=3, backoff_s=0.001)
        score = await judge.score(PARIS)
        assert score is not None and score.reward == 0.9 and not score.cached
        assert (judge.usage.malformed, judge.usage.retries, judge.usage.calls, judge.usage.failed) == (2, 2, 3, 0)
        assert judge.usage.prompt_tokens > 0 and judge.usage.completion_tokens > 0  # the cost counter
        again = await judge.score(PARIS)  # the same prompt: the cache answers, no request
        assert again is not None and again.cached and judge.usage.calls == 3 and judge.usage.cached == 1

        script_bad = ScriptedJudge(raw=["no idea"])
        async with FakeLLMServer(script_bad.fake_llm()) as bad_server:
            hopeless = LLMJudge(bad_server.base_url, "judge", max_retries=2, backoff_s=0.001, cache=False)
            assert await hopeless.score(PARIS) is None
            assert await hopeless.rank([PARIS, LYON]) == [None, None]
            assert hopeless.usage.malformed == 6 and hopeless.usage.failed == 2


async def test_http_failures_are_retried_with_backoff() -> None:
    script = ScriptedJudge(rubric=lambda req: 8)
    llm = script.fake_llm(failures=[Failure(status=503, times=1), Failure(kind="drop", times=1)])
    async with FakeLLMServer(llm) as server:
        judge = LLMJudge(server.base_url, "judge", max_retries=3, backoff_s=0.001)
        score = await judge.score(PARIS)
        assert score is not None and score.reward == 0.8
        assert judge.usage.retries == 2 and judge.usage.malformed == 0 and judge.usage.failed == 0


async def test_ranking_scores_a_group_relative_to_each_other() -> None:
    script = ScriptedJudge(ranking=lambda req: [0.9 if "Paris" in a else 0.1 for a in req.attempts])
    async with FakeLLMServer(script.fake_llm()) as server:
        judge = LLMJudge(server.base_url, "judge")
        scores = await judge.rank([LYON, PARIS, LYON])
        assert [s.reward for s in scores if s] == [0.1, 0.9, 0.1]
        assert len(script.ranking_requests) == 1 and len(script.ranking_requests[0].attempts) == 3
        assert "capital of France" in script.ranking_requests[0].task


async def test_judged_is_an_offline_reward_function() -> None:
    script = ScriptedJudge(rubric=lambda req: 10 if "Paris" in req.transcript else 0)
    async with FakeLLMServer(script.fake_llm()) as server:
        judge = LLMJudge(server.base_url, "judge")
        agent = judged(lambda task, resources: "Paris." if "France" in task["question"] else "Lyon.", judge)
        resources = t.Resources(llm=t.LLMEndpoint(base_url="http://unused/v1", model="m"))
        assert await agent({"question": "Capital of France?"}, resources) == 1.0
        assert await agent({"question": "Capital of Peru?"}, resources) == 0.0


@pytest.mark.parametrize("mode", ["rubric", "ranking"])
async def test_serve_judges_unrated_sessions_and_a_malformed_judge_never_stops_it(tmp_path: Path, mode: str) -> None:
    script = ScriptedJudge(
        rubric=lambda req: 10 if "Paris" in req.transcript else "garbage",
        ranking=lambda req: [0.8] * len(req.attempts),
    )
    async with (
        FakeLLMServer(FakeLLM(default_reply="Paris.")) as upstream,
        FakeLLMServer(script.fake_llm()) as judge_server,
    ):
        judge = LLMJudge(judge_server.base_url, "judge", max_retries=1, backoff_s=0.001)
        server = OnlineServer(
            db(tmp_path),
            upstream.base_url,
            state_dir=tmp_path / "state",
            token=TOKEN,
            sessions=SessionOptions(idle_s=60),
            judge=JudgeOptions(judge=judge, after_s=0, mode=mode, every_s=0.05, max_tries=2),
            metrics_every_s=3600,
        )
        async with server:
            assert server.judge is not None
            # hold the judge until both sessions are closed (one ranking group)
            options = server.judge.options
            server.judge.options = options.model_copy(update={"after_s": 1e9})
            for i in range(2):
                client = openai_client(server, **{"X-Agentbolt-Session-Id": f"u{i}"})
                await client.chat.completions.create(model="any", messages=[{"role": "user", "content": "France?"}])
                await server.sessions.close(f"u{i}")
            server.judge.options = options
            for _ in range(500):
                if all(s.judged for s in server.sessions.by_rollout.values()):
                    break
                await asyncio.sleep(0.02)
            sessions = list(server.sessions.by_rollout.values())
            assert len(sessions) == 2 and all(s.judged and s.has_final for s in sessions)
            spans = await reward_spans(server, sessions[0].rollout_id)
            assert len(spans) == 1 and spans[0].attributes[semconv.FEEDBACK_SOURCE] == "judge"
            expected = 1.0 if mode == "rubric" else 0.8
            assert spans[0].attributes[semconv.REWARD_VALUE] == expected
            assert server.metrics()["online/judged"] == 2.0
            assert len(script.ranking_requests) == (1 if mode == "ranking" else 0)

            # a session the judge cannot score: counted, tried max_tries sweeps, then left alone
            bad = openai_client(server, **{"X-Agentbolt-Session-Id": "odd"})
            await bad.chat.completions.create(model="any", messages=[{"role": "user", "content": "x"}])
            session = server.sessions.current["odd"]
            script._rubric = script._ranking = lambda req: "garbage"
            await server.sessions.close("odd")
            for _ in range(500):
                if server.judge.tries.get(session.rollout_id, 0) >= 2:
                    break
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.2)
            assert server.judge.tries[session.rollout_id] == 2 and not session.has_final
            assert judge.usage.malformed >= 2 and server.metrics()["judge/malformed"] >= 2
            # serving goes on
            await bad.chat.completions.create(model="any", messages=[{"role": "user", "content": "still there?"}])
