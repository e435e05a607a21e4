"""agentbolt serve records live calls into sessions: all three client APIs, streaming, the session
keys (header, metadata, trace, none), idle close and new segments."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.online import OnlineServer, SessionOptions
from agentbolt.testing.fake_llm import FakeLLM, FakeLLMServer, FakeTokenizer

from .helpers import TOKEN, anthropic_client, db, llm_spans, openai_client, session_rollouts

TOK = FakeTokenizer()


@pytest_asyncio.fixture(params=[30.0])
async def served(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[OnlineServer]:
    async with FakeLLMServer(FakeLLM(default_reply="Paris is the capital.")) as upstream:
        server = OnlineServer(
            db(tmp_path),
            upstream.base_url,
            state_dir=tmp_path / "state",
            token=TOKEN,
            sessions=SessionOptions(idle_s=request.param),
            metrics_every_s=0.2,
        )
        async with server:
            yield server


async def test_one_session_across_all_three_client_apis(served: OnlineServer) -> None:
    chat = openai_client(served, **{"X-Agentbolt-Session-Id": "conv-1"})
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    first = await chat.chat.completions.create(model="any", messages=messages)
    streamed = await chat.chat.completions.create(model="any", messages=messages, stream=True)
    chunks = [c async for c in streamed]
    response = await chat.responses.create(model="any", input="And of Italy?")
    message = await anthropic_client(served, **{"X-Agentbolt-Session-Id": "conv-1"}).messages.create(
        model="any", max_tokens=32, messages=[{"role": "user", "content": "And of Spain?"}]
    )
    assert first.choices[0].message.content == "Paris is the capital."
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Paris is the capital."
    rollouts = await session_rollouts(served.store, served.run_id)
    assert len(rollouts) == 1  # one session: every call in one rollout, one attempt
    rollout = rollouts[0]
    assert rollout.metadata["agentbolt.session.id"] == "conv-1" and rollout.status is t.RolloutStatus.RUNNING
    assert rollout.input["first_message"] == "What is the capital of France?"
    spans = await llm_spans(served, rollout.rollout_id)
    assert len(spans) == 4 and {s.attempt_id for s in spans} == {rollout.current_attempt_id}
    for span in spans:  # exact token ids from the upstream on every API, streamed or not
        assert span.attributes[semconv.TOKEN_SOURCE] == "exact"
        assert span.attributes[semconv.RESPONSE_TOKEN_IDS] == TOK.encode("Paris is the capital.")
    ids = [s.attributes[semconv.GEN_AI_RESPONSE_ID] for s in spans]
    assert ids[0] == first.id and ids[2] == response.id and ids[3] == message.id
    # the feedback index knows every response id
    assert all(served.sessions.of_response(i).rollout_id == rollout.rollout_id for i in ids)


async def test_answers_name_the_session_and_keyless_calls_are_sessions_of_their_own(served: OnlineServer) -> None:
    client = openai_client(served)
    raw = await client.chat.completions.with_raw_response.create(
        model="any", messages=[{"role": "user", "content": "hi"}]
    )
    session_id = raw.headers["x-agentbolt-session-id"]
    assert session_id.startswith("call-")
    await client.chat.completions.create(model="any", messages=[{"role": "user", "content": "hi again"}])
    by_meta = await client.chat.completions.create(
        model="any", messages=[{"role": "user", "content": "x"}], metadata={"session_id": "meta-7"}
    )
    traced = openai_client(served, traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    await traced.chat.completions.create(model="any", messages=[{"role": "user", "content": "y"}])
    await served.gateway.flush()
    keys = sorted(s.key for s in served.sessions.by_rollout.values())
    assert len([k for k in keys if k.startswith("call-")]) == 2
    assert "meta-7" in keys and "trace-0af7651916cd43dd8448eb211c80319c" in keys
    assert served.sessions.of_response(by_meta.id).key == "meta-7"
    # a keyless call's session closes when its call ends
    call_session = served.sessions.current[session_id]
    for _ in range(100):
        if call_session.closed:
            break
        await _sleep(0.02)
    rollout = (await served.store.get_rollouts([call_session.rollout_id]))[0]
    assert rollout.status is t.RolloutStatus.SUCCEEDED


@pytest.mark.parametrize("served", [0.2], indirect=True)
async def test_idle_sessions_close_and_a_later_call_opens_the_next_segment(served: OnlineServer) -> None:
    client = openai_client(served, **{"X-Agentbolt-Session-Id": "s-idle"})
    await client.chat.completions.create(model="any", messages=[{"role": "user", "content": "one"}])
    first = served.sessions.current["s-idle"]
    for _ in range(200):
        if first.closed:
            break
        await _sleep(0.02)
    assert first.closed
    await client.chat.completions.create(model="any", messages=[{"role": "user", "content": "two"}])
    second = served.sessions.current["s-idle"]
    assert second.segment == 1 and second.rollout_id != first.rollout_id
    states = {r.rollout_id: r.status for r in await served.store.get_rollouts([first.rollout_id, second.rollout_id])}
    assert states == {first.rollout_id: t.RolloutStatus.SUCCEEDED, second.rollout_id: t.RolloutStatus.RUNNING}


async def test_a_token_is_required_and_bad_session_keys_are_refused(served: OnlineServer) -> None:
    import openai

    with pytest.raises(openai.AuthenticationError):
        await openai_client(served, token="wrong").chat.completions.create(
            model="any", messages=[{"role": "user", "content": "hi"}]
        )
    with pytest.raises(openai.BadRequestError, match="at most 256"):
        await openai_client(served, **{"X-Agentbolt-Session-Id": "x" * 300}).chat.completions.create(
            model="any", messages=[{"role": "user", "content": "hi"}]
        )
    assert await session_rollouts(served.store, served.run_id) == []


async def test_off_loopback_without_a_token_is_refused(tmp_path: Path) -> None:
    from agentbolt.errors import UserError

    server = OnlineServer(db(tmp_path), "http://127.0.0.1:9/v1", state_dir=tmp_path / "s", host="0.0.0.0")
    with pytest.raises(UserError, match="without a token"):
        await server.start()
    await server.stop()


async def _sleep(seconds: float) -> None:
    import asyncio

    await asyncio.sleep(seconds)
