"""An OpenEnv server started in the test session, driven by ``Trainer.dev`` with the fake backend.

The server is OpenEnv's own (``HTTPEnvServer`` over the example's arithmetic environment, see
conftest.py); the agent is :class:`agentbolt_openenv.OpenEnvAgent` with its default ReAct loop;
the model is agentbolt.testing's fake OpenAI backend, scripted to answer "+" questions right and
"-" questions wrong. Checked against what the server itself recorded: exact token ids on every
call, the rewards the server returned (intermediate per step, the terminal step's as the final),
one session per rollout, every session closed, concurrent rollouts isolated, clear errors.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from openenv_server import RunningServer, free_port, openenv_arith

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.lightningrl import LightningRL
from agentbolt.store.memory import MemoryStore
from agentbolt.testing.fake_llm import FakeLLM, FakeLLMServer, FakeRequest, Rule
from agentbolt.trainer import Trainer
from agentbolt_openenv import OpenEnvAgent, OpenEnvServerError, ReActLoop, check_server, seed_tasks, server_tasks

QUESTION = re.compile(r"What is (\d+) ([+-]) (\d+)\?")


def scripted_answer(question: str) -> int:
    """The fake model's policy: right on "+", one too many on "-"."""
    m = QUESTION.search(question)
    assert m is not None, question
    a, op, b = int(m[1]), m[2], int(m[3])
    return a + b if op == "+" else a - b + 1


def reply(request: FakeRequest) -> str:
    """Answer the last question the chat asked (the latest observation may be feedback only)."""
    asked = [m["content"] for m in request.messages or [] if m["role"] == "user" and QUESTION.search(m["content"])]
    return f"Let me compute. <action>{scripted_answer(asked[-1])}</action>"


def fake_llm(**options: Any) -> FakeLLM:
    return FakeLLM(rules=[Rule(reply=reply)], **options)


def dev(agent: Any, tasks: list[Any], store: MemoryStore, llm: FakeLLM, concurrency: int = 4) -> Any:
    with FakeLLMServer(llm) as backend:
        return Trainer(
            agent, store=store, runners={"n": 0, "concurrency": concurrency}, capture={"adapters": []}, progress=False
        ).dev(tasks, llm=backend.base_url)


def rollouts_and_spans(store: MemoryStore) -> tuple[list[t.Rollout], dict[str, list[t.Span]]]:
    async def read() -> tuple[list[t.Rollout], dict[str, list[t.Span]]]:
        page = await store.query_rollouts(limit=1000)
        spans = await store.query_spans([r.rollout_id for r in page.items], latest_attempt_only=True)
        return list(page.items), spans

    return asyncio.run(read())


def rewards_of(spans: list[t.Span]) -> tuple[list[float], list[float]]:
    """(intermediate, final) reward values of a rollout's spans, in seq order."""
    found = [s for s in sorted(spans, key=lambda s: s.seq or 0) if s.name == semconv.SPAN_REWARD]
    intermediate = [s.attributes[semconv.REWARD_VALUE] for s in found if not s.attributes[semconv.REWARD_IS_FINAL]]
    final = [s.attributes[semconv.REWARD_VALUE] for s in found if s.attributes[semconv.REWARD_IS_FINAL]]
    return intermediate, final


def episode_id(rollout: t.Rollout, spans: list[t.Span]) -> str:
    attempts = {s.attempt_id for s in spans if s.attempt_id}
    assert len(attempts) == 1
    return f"{rollout.rollout_id}/{attempts.pop()}"


def test_rewards_are_the_servers_and_ids_exact(openenv_server: RunningServer) -> None:
    store = MemoryStore()
    tasks = seed_tasks(range(6), questions=3)
    result = dev(OpenEnvAgent(openenv_server.url, max_turns=5), tasks, store, fake_llm())

    assert result.succeeded == 6 and result.failed == 0
    assert result.llm_calls == 18 and result.calls_with_exact_ids == 18 and result.capture_ok()
    rollouts, spans = rollouts_and_spans(store)
    for rollout in rollouts:
        server_steps = openenv_server.log.steps_of(episode_id(rollout, spans[rollout.rollout_id]))
        questions = [q for q in openenv_arith.episode_problems(int(rollout.input["seed"]), "train", 3)]
        assert [s["question"] for s in server_steps] == [openenv_arith.question_of(p) for p in questions]
        assert [s["answer"] for s in server_steps] == [scripted_answer(s["question"]) for s in server_steps]
        assert [s["done"] for s in server_steps] == [False, False, True]
        # the terminal step's reward is the final reward; the others are intermediate, in order
        intermediate, _ = rewards_of(spans[rollout.rollout_id])
        assert intermediate == [s["reward"] for s in server_steps[:-1]]
        assert rollout.final_reward == server_steps[-1]["reward"]
        # each environment reward counts once
        assert sum(intermediate) + rollout.final_reward == pytest.approx(sum(s["reward"] for s in server_steps))
        # each intermediate reward names the call that chose its step's action, by the span id the
        # gateway sent in its response header (step k's action came from the rollout's k-th call)
        mine = sorted(spans[rollout.rollout_id], key=lambda s: s.start_time_ns)
        calls = [s.span_id for s in mine if s.name == semconv.SPAN_LLM_CALL]
        targets = [
            s.attributes.get(semconv.REWARD_TARGET_SPAN_ID)
            for s in mine
            if s.name == semconv.SPAN_REWARD and not s.attributes[semconv.REWARD_IS_FINAL]
        ]
        assert len(calls) == 3 and targets == calls[: len(targets)] and len(targets) == 2

    # LightningRL attaches each step's reward to the call that chose its action
    batch = LightningRL(credit="intermediate").process(rollouts, spans)
    assert batch.report.calls == 18 and {tr.token_source for tr in batch.transitions} == {t.TokenSource.EXACT}
    by_rollout: dict[str, list[t.Transition]] = {}
    for tr in batch.transitions:
        by_rollout.setdefault(tr.rollout_id, []).append(tr)
    for rollout in rollouts:
        server_steps = openenv_server.log.steps_of(episode_id(rollout, spans[rollout.rollout_id]))
        per_call = [tr.reward for tr in sorted(by_rollout[rollout.rollout_id], key=lambda tr: tr.index)]
        step_rewards = [s["reward"] for s in server_steps[:-1]] + [0.0]
        assert per_call == pytest.approx([rollout.final_reward + r for r in step_rewards])

    # one session per rollout, each reset once and closed
    assert len(openenv_server.log.envs) == 6
    assert all(env.resets == 1 and env.closed for env in openenv_server.log.envs)
    assert openenv_server.http_server.active_sessions == 0


def test_sum_rule_returns_the_episode_return(openenv_server: RunningServer) -> None:
    store = MemoryStore()
    result = dev(OpenEnvAgent(openenv_server.url, reward_rule="sum"), seed_tasks(range(4)), store, fake_llm())
    assert result.succeeded == 4
    rollouts, spans = rollouts_and_spans(store)
    for rollout in rollouts:
        server_steps = openenv_server.log.steps_of(episode_id(rollout, spans[rollout.rollout_id]))
        assert rollout.final_reward == pytest.approx(sum(s["reward"] for s in server_steps))
        assert rewards_of(spans[rollout.rollout_id])[0] == []  # nothing intermediate: it would count twice


def test_concurrent_rollouts_have_sessions_of_their_own(openenv_server: RunningServer) -> None:
    store = MemoryStore()
    tasks = seed_tasks(range(12), split="test")  # every rollout its own questions
    llm = fake_llm(latency_s=0.2)  # rollouts overlap: each waits on the model while others step
    result = dev(OpenEnvAgent(openenv_server.url), tasks, store, llm, concurrency=6)
    assert result.succeeded == 12 and result.capture_ok()
    log = openenv_server.log
    assert len(log.envs) == 12 and log.open_peak > 1  # sessions were open at the same time
    rollouts, spans = rollouts_and_spans(store)
    for rollout in rollouts:
        steps = log.steps_of(episode_id(rollout, spans[rollout.rollout_id]))
        # the session saw its own episode's questions and the answers to them, nothing of the others
        expected = [
            openenv_arith.question_of(p) for p in openenv_arith.episode_problems(int(rollout.input["seed"]), "test")
        ]
        assert [s["question"] for s in steps] == expected
        assert [s["answer"] for s in steps] == [scripted_answer(q) for q in expected]
        assert rollout.final_reward == steps[-1]["reward"]
    assert log.open_now == 0 and openenv_server.http_server.active_sessions == 0


def test_an_invalid_reply_costs_a_turn_and_truncation_gives_the_truncated_reward(
    openenv_server: RunningServer,
) -> None:
    def sloppy(request: FakeRequest) -> str:
        # the first reply of an episode has no action; after the feedback the model answers
        return "I am not sure." if len(request.messages or []) <= 3 else reply(request)

    store = MemoryStore()
    agent = OpenEnvAgent(openenv_server.url, max_turns=2, truncated_reward=-1.0)
    result = dev(agent, seed_tasks(range(3)), store, FakeLLM(rules=[Rule(match=lambda r: True, reply=sloppy)]))
    assert result.succeeded == 3 and result.llm_calls == 6
    rollouts, spans = rollouts_and_spans(store)
    for rollout in rollouts:
        steps = openenv_server.log.steps_of(episode_id(rollout, spans[rollout.rollout_id]))
        assert len(steps) == 1 and not steps[0]["done"]  # two turns: one without an action, one step
        assert rewards_of(spans[rollout.rollout_id])[0] == [steps[0]["reward"]]
        assert rollout.final_reward == -1.0  # cut before done: the agent's truncated_reward
        messages = [s.attributes.get(semconv.MESSAGE_BODY, "") for s in spans[rollout.rollout_id]]
        assert any("no <action>" in m for m in messages) and any("max_turns=2" in m for m in messages)


def test_a_server_that_is_down_gives_an_error_naming_the_url() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(OpenEnvServerError, match=re.escape(url) + ".*start the environment server"):
        check_server(url)
    store = MemoryStore()
    result = dev(OpenEnvAgent(url), seed_tasks(range(2)), store, fake_llm())
    # an unreachable server is infrastructure (retried while attempts remain), not the agent's fault
    assert result.failed == 2 and result.failures == {"infrastructure: OpenEnvServerError": 2}
    rollouts, _ = rollouts_and_spans(store)
    for rollout in rollouts:
        assert rollout.error is not None and url in rollout.error.message
        assert "uvicorn" in rollout.error.message  # says how to start one


@pytest.mark.parametrize("openenv_server", [1], indirect=True)
def test_a_full_server_says_to_raise_max_concurrent_envs(openenv_server: RunningServer) -> None:
    store = MemoryStore()
    result = dev(OpenEnvAgent(openenv_server.url), seed_tasks(range(4)), store, fake_llm(latency_s=0.3), concurrency=4)
    assert result.failed >= 1 and result.succeeded >= 1  # one session at a time: the others are refused
    rollouts, _ = rollouts_and_spans(store)
    refused = [r for r in rollouts if r.status is t.RolloutStatus.FAILED]
    for rollout in refused:
        assert rollout.error is not None and "max_concurrent_envs" in rollout.error.message
    assert openenv_server.http_server.active_sessions == 0


def test_an_environment_error_names_the_step(openenv_server: RunningServer) -> None:
    store = MemoryStore()
    result = dev(OpenEnvAgent(openenv_server.url), [{"seed": 1, "questions": 11}], store, fake_llm())
    assert result.failures == {"agent: OpenEnvStepError": 1}
    rollouts, _ = rollouts_and_spans(store)
    assert rollouts[0].error is not None
    assert "raised in reset" in rollouts[0].error.message and "questions must be between 1 and 10" in (
        rollouts[0].error.message
    )


def test_tasks_from_the_servers_task_api(openenv_server: RunningServer) -> None:
    tasks = server_tasks(openenv_server.url, "test")
    assert len(tasks) == 200 and tasks[3] == {"task_id": "test-3", "split": "test", "index": 3}
    store = MemoryStore()
    result = dev(OpenEnvAgent(openenv_server.url), tasks[:2], store, fake_llm())
    assert result.succeeded == 2
    rollouts, spans = rollouts_and_spans(store)
    for rollout in rollouts:
        steps = openenv_server.log.steps_of(episode_id(rollout, spans[rollout.rollout_id]))
        index = int(rollout.input["index"])
        assert [s["question"] for s in steps] == [
            openenv_arith.question_of(p) for p in openenv_arith.episode_problems(index, "test")
        ]


def test_a_loop_of_ones_own(openenv_server: RunningServer) -> None:
    """The user's loop: one model call per step, its own prompt and parsing; the session records rewards."""

    async def my_loop(env: Any, llm: Any, model: str) -> None:
        while not env.over:
            text = env.observation["text"]
            answer = await llm.chat.completions.create(model=model, messages=[{"role": "user", "content": text}])
            number = re.search(r"<action>(-?\d+)</action>", answer.choices[0].message.content)
            await env.step({"answer": int(number[1])})

    store = MemoryStore()
    result = dev(OpenEnvAgent(openenv_server.url, loop=my_loop), seed_tasks(range(3)), store, fake_llm())
    assert result.succeeded == 3 and result.llm_calls == 6 and result.capture_ok()
    rollouts, spans = rollouts_and_spans(store)
    for rollout in rollouts:
        steps = openenv_server.log.steps_of(episode_id(rollout, spans[rollout.rollout_id]))
        assert rollout.final_reward == steps[-1]["reward"]
        assert rewards_of(spans[rollout.rollout_id])[0] == [steps[0]["reward"]]


def test_the_default_loop_shows_the_action_schema(openenv_server: RunningServer) -> None:
    seen: list[str] = []

    def remember(request: FakeRequest) -> str:
        seen.append((request.messages or [{}])[0].get("content", ""))
        return reply(request)

    store = MemoryStore()
    dev(
        OpenEnvAgent(openenv_server.url, loop=ReActLoop()),
        seed_tasks([5]),
        store,
        FakeLLM(rules=[Rule(reply=remember)]),
    )
    assert seen and '"answer"' in seen[0] and "<action></action>" in seen[0]


def test_sum_rule_without_any_step_gives_the_truncated_reward(openenv_server: RunningServer) -> None:
    store = MemoryStore()
    agent = OpenEnvAgent(openenv_server.url, reward_rule="sum", max_turns=2)
    result = dev(agent, seed_tasks(range(2)), store, FakeLLM(rules=[Rule(reply="No idea.")]))
    assert result.succeeded == 2 and result.llm_calls == 4
    rollouts, _ = rollouts_and_spans(store)
    assert [r.final_reward for r in rollouts] == [0.0, 0.0]  # no answer, no step: truncated_reward
    assert all(env.log == [] for env in openenv_server.log.envs)


def test_a_server_that_stops_mid_episode_fails_the_rollout_clearly(tmp_path: Path) -> None:
    """The server process (OpenEnv's Python server mode) is killed while the model answers the
    second question: the rollout fails naming the URL, and no new session is opened silently."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    script = Path(openenv_arith.__file__)
    proc = subprocess.Popen([sys.executable, str(script), "--port", str(port)], cwd=tmp_path)
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                check_server(url, timeout_s=5.0)
                break
            except OpenEnvServerError:
                assert proc.poll() is None and time.monotonic() < deadline, "the server did not start"
                time.sleep(0.5)

        def kill_on_second_question(request: FakeRequest) -> str:
            if "Question 2 of 2" in request.text:
                proc.kill()
                proc.wait(timeout=30)
            return reply(request)

        store = MemoryStore()
        llm = FakeLLM(rules=[Rule(reply=kill_on_second_question)])
        result = dev(OpenEnvAgent(url), seed_tasks([1]), store, llm, concurrency=1)
        assert result.failed == 1 and result.failures == {"agent: OpenEnvServerError": 1}
        rollouts, _ = rollouts_and_spans(store)
        message = rollouts[0].error.message if rollouts[0].error else ""
        assert url in message and ("closed before step" in message or "broke during step" in message), message
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


@pytest.mark.filterwarnings("ignore::agentbolt.capture.emit.NoRolloutWarning")  # driven outside any rollout
def test_a_session_driven_directly(openenv_server: RunningServer) -> None:
    """open_session without a trainer: the episode's bookkeeping and its refusals."""
    from agentbolt.errors import UserError
    from agentbolt_openenv import OpenEnvActionError, open_session

    async def run() -> None:
        async with open_session(openenv_server.url, max_turns=2) as env:
            with pytest.raises(UserError, match="before reset"):
                await env.step({"answer": 1})
            await env.reset(seed=4, split="test")
            gold = [openenv_arith.answer_of(p) for p in openenv_arith.episode_problems(4, "test")]
            with pytest.raises(OpenEnvActionError, match="action schema"):
                await env.step({"answer": "not a number"})
            assert env.steps == [] and env.refused_actions == 1
            first = await env.step({"answer": gold[0]})
            second = await env.step({"answer": gold[1] + 1})
            assert (first.reward, first.done, second.reward, second.done) == (0.5, False, 0.0, True)
            assert env.over and env.final_reward() == 0.0  # terminal rule: the done step's reward
            with pytest.raises(UserError, match="the episode is over"):
                await env.step({"answer": 0})
            state = await env.state()
            assert state["answers"] == [gold[0], gold[1] + 1] and state["step_count"] == 2
            await env.reset(seed=5, split="test")  # a new episode on the same session
            assert env.steps == [] and not env.over
        for _ in range(200):  # the server closes the environment once it sees the socket close
            if openenv_server.log.envs[0].closed:
                break
            await asyncio.sleep(0.05)
        assert len(openenv_server.log.envs) == 1 and openenv_server.log.envs[0].closed

    asyncio.run(run())
