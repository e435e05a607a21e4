"""Background training in agentbolt serve: rewarded sessions become an update, the gate keeps a
worse version out, a better one goes live by a swap that fails no concurrent request, and the live
version survives a restart. The "model" is a ScriptedPolicy (named reply functions behind two fake
OpenAI-compatible servers); the store, gateway, LightningRL, gate and ledger are the real ones."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai

from agentbolt import types as t
from agentbolt.online import GateOptions, OnlineServer, SessionOptions, UpdateOptions
from agentbolt.testing.fake_llm import FakeRequest
from agentbolt.testing.scripted_policy import ScriptedPolicy

from .helpers import TOKEN, db, openai_client, post_feedback

CAPITALS = {"France": "Paris", "Italy": "Rome", "Spain": "Madrid", "Japan": "Tokyo", "Peru": "Lima"}
HELD_OUT = [{"country": c, "answer": a} for c, a in list(CAPITALS.items())[:4]]


def _right(request: FakeRequest) -> str:
    return next((f"{city}." for country, city in CAPITALS.items() if country in request.text), "I do not know.")


def _policy(update: str, *, latency_s: float = 0.0) -> ScriptedPolicy:
    weights = {"base": _right, "same": _right, "worse": lambda req: "Lyon."}
    return ScriptedPolicy(weights, initial="base", updates=[update], latency_s=latency_s)


async def held_out_agent(task: dict[str, Any], resources: t.Resources) -> float:
    """The gate's agent: asks for a capital, 1 if the answer names it."""
    async with openai.AsyncOpenAI(base_url=resources.llm.base_url, api_key="x", max_retries=0) as client:
        answer = await client.chat.completions.create(
            model=resources.llm.model, messages=[{"role": "user", "content": f"Capital of {task['country']}?"}]
        )
    return 1.0 if task["answer"] in (answer.choices[0].message.content or "") else 0.0


async def _until(condition: Callable[[], bool], timeout_s: float = 60.0) -> None:
    for _ in range(int(timeout_s / 0.02)):
        if condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached")


def _server(tmp_path: Path, policy: ScriptedPolicy) -> OnlineServer:
    return OnlineServer(
        db(tmp_path),
        policy,
        state_dir=tmp_path / "state",
        token=TOKEN,
        sessions=SessionOptions(idle_s=60),
        updates=UpdateOptions(min_sessions=3, grouping="batch", check_every_s=3600, drain_timeout_s=5),
        gate=GateOptions(agent=held_out_agent, tasks=HELD_OUT, samples=2),
        metrics_every_s=3600,
    )


async def _rated_sessions(server: OnlineServer, n: int) -> None:
    """``n`` closed sessions with client feedback (different rewards, so GRPO has signal)."""
    for i in range(n):
        client = openai_client(server, **{"X-Agentbolt-Session-Id": f"user-{i}"})
        await client.chat.completions.create(
            model="any", messages=[{"role": "user", "content": f"Capital of Peru? #{i}"}]
        )
        answer = await post_feedback(server, {"feedback_id": f"fb-{i}", "session_id": f"user-{i}", "reward": i % 2})
        assert answer.status_code == 200, answer.text
        await server.sessions.close(f"user-{i}")


async def test_the_gate_keeps_a_worse_version_out_and_says_why(tmp_path: Path) -> None:
    policy = _policy("worse")
    async with _server(tmp_path, policy) as server:
        await _rated_sessions(server, 3)
        assert server.trainer is not None
        decision = await server.trainer.step()
        assert decision is not None and not decision.passed
        assert "below the noise bound" in decision.reason
        assert decision.live is not None and decision.live.mean == 1.0
        assert decision.candidate is not None and decision.candidate.mean == 0.0
        assert policy.rows_seen == [3]  # it did train on the three sessions
        assert policy.live_weights == "base" and policy.training == "base"  # reverted, still live
        assert server.live_version == 1 and server.status()["decisions"][-1]["passed"] is False
        # the sessions were consumed: no second update from the same ones
        assert await server.trainer.step(force=True) is None
        # a rating that arrives now is stored, and the answer says no update will train on it
        late = await post_feedback(server, {"feedback_id": "late", "session_id": "user-0", "reward": 1.0})
        assert late.status_code == 200, late.text
        assert late.json()["status"] == "recorded_not_trained"
        assert late.json()["detail"] == "session already trained in version 1"
        live = await openai_client(server).chat.completions.create(
            model="any", messages=[{"role": "user", "content": "Capital of Japan?"}]
        )
        assert live.choices[0].message.content == "Tokyo."
    events = [e["event"] for e in server.ledger.replay()]
    assert events.count("gate") == 1 and events.count("live") == 1  # only the initial version went live


async def test_a_swap_under_concurrent_traffic_fails_no_request_and_survives_a_restart(tmp_path: Path) -> None:
    policy = _policy("same", latency_s=0.05)
    server = _server(tmp_path, policy)
    await server.start()
    try:
        await _rated_sessions(server, 3)
        failures: list[BaseException] = []
        answered: list[int] = []
        stop = asyncio.Event()

        async def user(i: int) -> None:
            client = openai_client(server, **{"X-Agentbolt-Session-Id": f"live-{i}"})
            while not stop.is_set():
                try:
                    reply = await client.chat.completions.create(
                        model="any", messages=[{"role": "user", "content": "Capital of Italy?"}]
                    )
                    assert reply.choices[0].message.content == "Rome."
                    answered.append(i)
                except BaseException as exc:
                    failures.append(exc)

        users = [asyncio.create_task(user(i)) for i in range(6)]
        await _until(lambda: len(answered) >= 6)
        before = len(answered)
        assert server.trainer is not None
        decision = await server.trainer.step()
        await _until(lambda: len(answered) >= before + 12)
        stop.set()
        await asyncio.gather(*users)
        assert decision is not None and decision.passed, decision
        assert failures == []
        assert len(answered) >= before + 12  # traffic flowed through the swap
        assert server.live_version == decision.version and policy.live == 1
        assert policy.slots[1].requests > 0 and policy.slots[0].requests > 0  # both slots served live calls
        assert server.swaps[-1]["version"] == decision.version
        version, run_id = server.live_version, server.run_id
    finally:
        await server.stop()

    again = _server(tmp_path, _policy("same"))
    async with again:
        assert again.run_id == run_id and again.live_version == version
        assert again.live_score is not None and again.live_score.version == version
        assert again.trainer is not None and again.trainer.ready() == []  # trained sessions stay trained
        assert (tmp_path / "state" / "versions" / f"v{version}" / "weights.json").exists()
        reply = await openai_client(again).chat.completions.create(
            model="any", messages=[{"role": "user", "content": "Capital of Spain?"}]
        )
        assert reply.choices[0].message.content == "Madrid."


async def test_sessions_that_ask_a_held_out_task_never_train_and_are_counted(tmp_path: Path) -> None:
    # held-out tasks with a question text; a few-shot agent sends worked examples before the question
    held_out = [
        {"question": "Capital of France?", "answer": "Paris"},
        {"question": "Capital of Italy?", "answer": "Rome"},
    ]
    shots = [{"role": "user", "content": "Capital of Peru?"}, {"role": "assistant", "content": "Lima."}]
    server = OnlineServer(
        db(tmp_path),
        _policy("same"),
        state_dir=tmp_path / "state",
        token=TOKEN,
        sessions=SessionOptions(idle_s=60),
        updates=UpdateOptions(min_sessions=1, grouping="batch", check_every_s=3600),
        gate=GateOptions(agent=held_out_agent, tasks=held_out),
        metrics_every_s=3600,
    )
    asked = {
        "few-shot": ([*shots, {"role": "user", "content": "capital of  FRANCE?"}], {}),  # the question comes last
        "task-key": ([{"role": "user", "content": "Which city?"}], {"X-Agentbolt-Task-Key": "Capital of Italy?"}),
        "fresh": ([*shots, {"role": "user", "content": "Capital of Spain?"}], {}),  # not held out: trains
    }
    async with server:
        for session, (messages, headers) in asked.items():
            client = openai_client(server, **{"X-Agentbolt-Session-Id": session, **headers})
            await client.chat.completions.create(model="any", messages=messages)
            answer = await post_feedback(server, {"feedback_id": f"fb-{session}", "session_id": session, "reward": 1})
            assert answer.status_code == 200, answer.text
            await server.sessions.close(session)
        assert server.trainer is not None
        assert [s.key for s in server.trainer.ready()] == ["fresh"]
        assert server.metrics()["online/held_out_overlap"] == 2.0
