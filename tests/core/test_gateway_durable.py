"""An answered call is in the store before the client has the whole answer (``durable_calls``):
non-streaming answers are sent after the span is written, streams hold ``data: [DONE]`` (or the
translated API's closing events) until then. The store here is slow on purpose, so a gateway that
answered first would be caught with the span still missing."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Sequence

import anthropic
import openai
import pytest
import pytest_asyncio
from hypothesis import given
from hypothesis import strategies as st

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.gateway import Gateway
from agentbolt.gateway.recorder import CallRecord
from agentbolt.gateway.relay import _HoldDone
from agentbolt.gateway.span_writer import SpanWriter
from agentbolt.store.memory import MemoryStore
from agentbolt.testing.fake_llm import FakeLLM, FakeLLMServer

SLOW_S = 0.3


class SlowStore(MemoryStore):
    """A memory store whose span writes take ``SLOW_S`` (a busy database)."""

    writes = 0

    async def _add_spans(self, spans: Sequence[t.Span]) -> int:
        self.writes += 1
        await asyncio.sleep(SLOW_S)
        return await super()._add_spans(spans)


class Env:
    def __init__(self, store: MemoryStore, gateway: Gateway, rollout_id: str, attempt_id: str) -> None:
        self.store, self.gateway, self.rollout_id, self.attempt_id = store, gateway, rollout_id, attempt_id

    @property
    def base(self) -> str:
        return self.gateway.base_url_for(self.rollout_id, self.attempt_id)

    async def stored_calls(self) -> list[t.Span]:
        """The LLM-call spans in the store now (no flush: what a crash would leave)."""
        spans = (await self.store.query_spans([self.rollout_id]))[self.rollout_id]
        return [s for s in spans if s.attributes.get(semconv.SPAN_KIND_ATTR) == semconv.KIND_LLM]


@pytest_asyncio.fixture
async def env() -> AsyncIterator[Env]:
    store = SlowStore()
    await store.enqueue([t.RolloutSpec(rollout_id="r")])
    (claim,) = await store.dequeue("w")
    async with FakeLLMServer(FakeLLM(default_reply="The answer is 42.")) as server:
        gateway = Gateway(store, [server.base_url])
        await gateway.start()
        try:
            yield Env(store, gateway, "r", claim.attempt.attempt_id)
        finally:
            await gateway.stop()
            await store.close()


@pytest.mark.parametrize("stream", [False, True])
async def test_a_chat_completion_is_stored_before_the_client_has_it(env: Env, stream: bool) -> None:
    client = openai.AsyncOpenAI(base_url=env.base, api_key="k", max_retries=0)
    messages = [{"role": "user", "content": "6 times 7?"}]
    for n in range(1, 4):
        if stream:
            chunks = [c async for c in await client.chat.completions.create(model="m", messages=messages, stream=True)]  # type: ignore[arg-type]
            response_id = chunks[0].id
        else:
            response_id = (await client.chat.completions.create(model="m", messages=messages)).id  # type: ignore[arg-type]
        calls = await env.stored_calls()
        assert len(calls) == n and calls[-1].attributes[semconv.GEN_AI_RESPONSE_ID] == response_id


@pytest.mark.parametrize("stream", [False, True])
async def test_responses_and_messages_answers_are_stored_before_the_client_has_them(env: Env, stream: bool) -> None:
    responses = openai.AsyncOpenAI(base_url=env.base, api_key="k", max_retries=0)
    if stream:
        events = [e async for e in await responses.responses.create(model="m", input="6 times 7?", stream=True)]
        assert events[-1].type == "response.completed"
    else:
        await responses.responses.create(model="m", input="6 times 7?")
    assert len(await env.stored_calls()) == 1
    messages = anthropic.AsyncAnthropic(base_url=env.base.removesuffix("/v1"), api_key="k", max_retries=0)
    request = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "6 times 7?"}]}
    if stream:
        async with messages.messages.stream(**request) as events:  # type: ignore[arg-type]
            await events.get_final_message()
    else:
        await messages.messages.create(**request)  # type: ignore[arg-type]
    assert len(await env.stored_calls()) == 2


async def test_concurrent_calls_are_group_committed(env: Env) -> None:
    """Many calls waiting at once share store writes (fewer writes than calls), all stored."""
    client = openai.AsyncOpenAI(base_url=env.base, api_key="k", max_retries=0)
    await asyncio.gather(
        *(client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"q{i}"}]) for i in range(16))
    )
    assert len(await env.stored_calls()) == 16
    assert isinstance(env.store, SlowStore) and env.store.writes < 16
    assert env.gateway.stats()["spans_late"] == 0


class StuckStore(MemoryStore):
    """A memory store whose span writes wait until the test lets them through."""

    def __init__(self) -> None:
        super().__init__()
        self.through = asyncio.Event()

    async def _add_spans(self, spans: Sequence[t.Span]) -> int:
        await self.through.wait()
        return await super()._add_spans(spans)


async def test_a_call_the_store_does_not_take_in_time_is_counted_late_and_still_written() -> None:
    store = StuckStore()
    await store.enqueue([t.RolloutSpec(rollout_id="r")])
    (claim,) = await store.dequeue("w")
    writer = SpanWriter(store, interval_s=0.05, batch=64, max_buffered=100, retokenize=None)
    writer.start()
    try:
        record = CallRecord("r", claim.attempt.attempt_id, semconv.OP_CHAT, {"model": "m"}, "http://u", 1)
        assert await writer.write(record, "a" * 16, timeout=0.05) is False
        assert writer.late == 1 and writer.written == 0
        store.through.set()
        assert await writer.write(record, "b" * 16) is True  # the late span first, then this one
        assert writer.late == 1 and writer.written == 2
        assert {s.span_id for s in (await store.query_spans(["r"]))["r"]} == {"a" * 16, "b" * 16}
    finally:
        await writer.stop()
        await store.close()


def _sse(n: int, quoted: int = -1) -> bytes:
    """``n`` content events (event ``quoted`` says ``data: [DONE]`` in its text), then ``[DONE]``."""
    words = [b"data: [DONE]" if i == quoted else b"w%d" % i for i in range(n)]
    events = [b'data: {"choices": [{"index": 0, "delta": {"content": "%s"}}]}\n\n' % w for w in words]
    return b"".join(events) + b"data: [DONE]\n\n"


@given(n=st.integers(0, 5), quoted=st.integers(-1, 4), cuts=st.lists(st.integers(0, 400), max_size=12))
def test_the_done_event_is_held_back_however_the_stream_is_split(n: int, quoted: int, cuts: list[int]) -> None:
    data = _sse(n, quoted)
    points = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    holder = _HoldDone()
    sent = b""
    for a, b in itertools.pairwise(points):
        sent += holder.feed(data[a:b])
        done_at = data.rindex(b"data: [DONE]")
        assert len(sent) <= done_at  # nothing from [DONE] on leaves early ...
        if b >= done_at:  # ... and every complete event before it has left already
            assert sent == data[:done_at]
    assert sent + holder.pending == data and holder.held
