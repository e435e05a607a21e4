"""The fake OpenAI-compatible server (agentbolt.testing.fake_llm), driven by the real openai client."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentbolt.errors import UserError
from agentbolt.testing.fake_llm import (
    DEFAULT_REPLY,
    Failure,
    FakeLLM,
    FakeLLMApp,
    FakeLLMProcess,
    FakeLLMServer,
    FakeRequest,
    FakeTokenizer,
    Rule,
    ToolCall,
    ToolCalls,
    expected_logprobs,
)
from agentbolt.testing.fake_llm.tokenizer import IM_END, IM_START

TOK = FakeTokenizer()
MODEL = "fake-model"
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TOKEN_IDS = {"return_token_ids": True}


def make_llm(**kwargs: Any) -> FakeLLM:
    return FakeLLM(
        rules=[
            Rule(match="weather", reply=ToolCalls([ToolCall("get_weather", {"city": "Paris"})])),
            Rule(match=r"^Sunny", reply="It is sunny in Paris today."),
            Rule(match="count", reply="one two three four five six seven eight nine ten"),
            Rule(match="echo", reply=lambda req: f"you said: {req.text}"),
        ],
        **kwargs,
    )


@pytest.fixture(scope="module")
def server() -> Iterator[FakeLLMServer]:
    """One thread-backed server shared by the read-only tests (sync and async clients alike)."""
    with FakeLLMServer(make_llm()) as s:
        yield s


@pytest.fixture
async def client(server: FakeLLMServer) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0) as c:
        yield c


@contextlib.asynccontextmanager
async def serve(llm: FakeLLM, **client_options: Any) -> AsyncIterator[tuple[FakeLLMServer, openai.AsyncOpenAI]]:
    """A fresh in-process server on this test's event loop, and a client for it."""
    options = {"api_key": "x", "max_retries": 0, **client_options}
    async with FakeLLMServer(llm) as server, openai.AsyncOpenAI(base_url=server.base_url, **options) as client:
        yield server, client


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": "You are terse."}, {"role": "user", "content": text}]


# --------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------


@given(st.text())
def test_tokenizer_round_trips_any_text(text: str) -> None:
    ids = TOK.encode(text)
    assert TOK.decode(ids) == text
    assert "".join(TOK.token_text(i) for i in ids) == text
    assert all(0 <= i < TOK.vocab_size < 2**31 for i in ids)


def test_tokenizer_pieces_and_specials() -> None:
    assert [TOK.token_text(i) for i in TOK.encode("Hello, world")] == ["Hell", "o", ",", " worl", "d"]
    ids = TOK.render_chat([{"role": "user", "content": "hi"}])
    assert ids[0] == IM_START and IM_END in ids
    assert TOK.decode(ids) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert TOK.decode([*TOK.encode("ok"), IM_END], skip_special_tokens=True) == "ok"
    with pytest.raises(ValueError):
        TOK.decode([2**31])


def test_logprobs_are_deterministic_and_prompt_dependent() -> None:
    response = TOK.encode("the same answer")
    a = expected_logprobs(TOK.encode("prompt one"), response)
    assert a == expected_logprobs(TOK.encode("prompt one"), response)
    assert a != expected_logprobs(TOK.encode("prompt two"), response)
    assert all(-1.0 <= lp < 0 for lp in a)
    for tops in TOK.expected_top_logprobs(TOK.encode("p"), response, 4):
        lps = [lp for _, lp in tops]
        assert lps == sorted(lps, reverse=True) and len({t for t, _ in tops}) == 4


# --------------------------------------------------------------------------------------------
# Chat and completions: token ids, logprobs, usage
# --------------------------------------------------------------------------------------------


async def test_chat_returns_exact_token_ids_and_logprobs(client: openai.AsyncOpenAI) -> None:
    messages = user("Sunny?")
    r = await client.chat.completions.create(
        model=MODEL, messages=messages, logprobs=True, top_logprobs=3, extra_body=TOKEN_IDS
    )
    choice = r.choices[0]
    assert r.id.startswith("chatcmpl-") and r.object == "chat.completion" and r.model == MODEL
    assert choice.message.content == "It is sunny in Paris today." and choice.finish_reason == "stop"
    prompt_ids = TOK.render_chat(messages)
    assert r.prompt_token_ids == prompt_ids
    assert choice.token_ids == TOK.encode(choice.message.content)
    assert TOK.decode(choice.token_ids) == choice.message.content
    entries = choice.logprobs.content
    assert [e.logprob for e in entries] == expected_logprobs(prompt_ids, choice.token_ids)
    assert "".join(e.token for e in entries) == choice.message.content
    assert entries[0].bytes == list(entries[0].token.encode())
    tops = TOK.expected_top_logprobs(prompt_ids, choice.token_ids, 3)
    for entry, expected in zip(entries, tops, strict=True):
        assert [(t.token, t.logprob) for t in entry.top_logprobs] == [(TOK.token_text(i), lp) for i, lp in expected]
    assert r.usage.prompt_tokens == len(prompt_ids)
    assert r.usage.completion_tokens == len(choice.token_ids)
    assert r.usage.total_tokens == len(prompt_ids) + len(choice.token_ids)


async def test_token_data_only_when_asked(client: openai.AsyncOpenAI) -> None:
    r = await client.chat.completions.create(model=MODEL, messages=user("hello"))
    assert r.choices[0].message.content == DEFAULT_REPLY
    assert r.choices[0].logprobs is None
    extras = {**(r.model_extra or {}), **(r.choices[0].model_extra or {})}
    assert "prompt_token_ids" not in extras and "token_ids" not in extras
    r2 = await client.chat.completions.create(model=MODEL, messages=user("hello"))
    assert r2.id != r.id


async def test_completions_return_token_ids_and_logprobs(client: openai.AsyncOpenAI) -> None:
    r = await client.completions.create(model=MODEL, prompt="count to ten", logprobs=2, extra_body=TOKEN_IDS)
    choice = r.choices[0]
    assert r.id.startswith("cmpl-") and r.object == "text_completion"
    assert choice.text == "one two three four five six seven eight nine ten"
    prompt_ids = TOK.encode("count to ten")
    assert choice.prompt_token_ids == prompt_ids
    assert choice.token_ids == TOK.encode(choice.text)
    lp = choice.logprobs
    assert lp.token_logprobs == expected_logprobs(prompt_ids, choice.token_ids)
    assert lp.tokens == [TOK.token_text(i) for i in choice.token_ids]
    assert [choice.text[o : o + len(t)] for o, t in zip(lp.text_offset, lp.tokens, strict=True)] == lp.tokens
    assert all(len(d) == 2 and d[t] == x for d, t, x in zip(lp.top_logprobs, lp.tokens, lp.token_logprobs, strict=True))
    assert r.usage.completion_tokens == len(choice.token_ids) and r.usage.prompt_tokens == len(prompt_ids)


async def test_completions_accept_token_id_prompts_and_batches(client: openai.AsyncOpenAI) -> None:
    ids = TOK.encode("echo this")
    r = await client.completions.create(model=MODEL, prompt=[ids, TOK.encode("count")], n=2, extra_body=TOKEN_IDS)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert r.choices[0].text == "you said: echo this" and r.choices[0].prompt_token_ids == ids
    assert r.choices[3].text.startswith("one two")
    assert r.usage.prompt_tokens == len(ids) + len(TOK.encode("count"))
    assert r.usage.completion_tokens == sum(len(c.token_ids) for c in r.choices)


def test_sync_client_and_models_endpoint(server: FakeLLMServer) -> None:
    with openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0) as client:
        assert [m.id for m in client.models.list()] == [MODEL]
        r = client.chat.completions.create(model=MODEL, messages=user("echo ping"))
        assert r.choices[0].message.content == "you said: echo ping"


# --------------------------------------------------------------------------------------------
# Streaming
# --------------------------------------------------------------------------------------------


async def test_chat_stream_assembles_to_the_non_stream_answer(client: openai.AsyncOpenAI) -> None:
    messages = user("count please")
    kwargs: dict[str, Any] = {"model": MODEL, "messages": messages, "logprobs": True, "extra_body": TOKEN_IDS}
    full = await client.chat.completions.create(**kwargs)
    stream = await client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True})
    chunks = [c async for c in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].prompt_token_ids == full.prompt_token_ids
    assert all((c.model_extra or {}).get("prompt_token_ids") is None for c in chunks[1:])
    assert len({c.id for c in chunks}) == 1 and chunks[0].id.startswith("chatcmpl-")
    body = [c for c in chunks if c.choices]
    text = "".join(c.choices[0].delta.content or "" for c in body)
    ids = [i for c in body for i in c.choices[0].token_ids]
    logprobs = [e.logprob for c in body if c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert text == full.choices[0].message.content
    assert ids == full.choices[0].token_ids
    assert logprobs == [e.logprob for e in full.choices[0].logprobs.content]
    assert body[-1].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == full.usage.model_dump()


async def test_completions_stream_with_n_choices(client: openai.AsyncOpenAI) -> None:
    kwargs: dict[str, Any] = {"model": MODEL, "prompt": "count", "n": 2, "logprobs": 1, "extra_body": TOKEN_IDS}
    full = await client.completions.create(**kwargs)
    stream = await client.completions.create(**kwargs, stream=True)
    text, ids, lps, prompt_ids = ["", ""], [[], []], [[], []], [None, None]
    async for chunk in stream:
        for c in chunk.choices:
            text[c.index] += c.text
            ids[c.index] += c.token_ids
            lps[c.index] += c.logprobs.token_logprobs if c.logprobs else []
            if (c.model_extra or {}).get("prompt_token_ids") is not None:
                assert prompt_ids[c.index] is None
                prompt_ids[c.index] = c.prompt_token_ids
    for i, c in enumerate(full.choices):
        assert (text[i], ids[i], lps[i]) == (c.text, c.token_ids, c.logprobs.token_logprobs)
        assert prompt_ids[i] == c.prompt_token_ids == TOK.encode("count")


async def test_raw_sse_framing(server: FakeLLMServer) -> None:
    async with httpx.AsyncClient(base_url=server.base_url) as http:
        body = {"model": MODEL, "messages": user("hi"), "stream": True}
        async with http.stream("POST", "/chat/completions", json=body) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            raw = (await r.aread()).decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert all(e.startswith("data: ") for e in events[:-1])
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-1]["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)


# --------------------------------------------------------------------------------------------
# Tools, n, max_tokens, stop
# --------------------------------------------------------------------------------------------


async def test_tool_call_round_trip(client: openai.AsyncOpenAI) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is the weather in Paris?"}]
    r1 = await client.chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER_TOOL], extra_body=TOKEN_IDS
    )
    c1 = r1.choices[0]
    assert c1.finish_reason == "tool_calls" and c1.message.content is None
    (call,) = c1.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    assert r1.prompt_token_ids == TOK.render_chat(messages, [WEATHER_TOOL])
    assert c1.token_ids == TOK.render_tool_calls([("get_weather", call.function.arguments)])
    assert r1.usage.completion_tokens == len(c1.token_ids)

    messages += [
        c1.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 25 C"},
    ]
    r2 = await client.chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER_TOOL], extra_body=TOKEN_IDS
    )
    assert r2.choices[0].message.content == "It is sunny in Paris today."
    # The second prompt extends the first prompt and its response: exact-prefix trajectory merging works.
    turn1 = r1.prompt_token_ids + c1.token_ids + [IM_END]
    assert r2.prompt_token_ids[: len(turn1)] == turn1

    stream = await client.chat.completions.create(
        model=MODEL, messages=messages[:1], tools=[WEATHER_TOOL], stream=True, extra_body=TOKEN_IDS
    )
    name, args, ids, finish = "", "", [], None
    async for chunk in stream:
        choice = chunk.choices[0]
        ids += choice.token_ids
        finish = choice.finish_reason or finish
        for delta in choice.delta.tool_calls or []:
            assert delta.index == 0
            name += delta.function.name or ""
            args += delta.function.arguments or ""
    assert (name, json.loads(args), finish) == ("get_weather", {"city": "Paris"}, "tool_calls")
    assert ids == TOK.render_tool_calls([("get_weather", args)])


async def test_n_choices_from_a_script() -> None:
    llm = FakeLLM(rules=[Rule(match="pick", reply=["alpha", "beta", "gamma"])], default_reply="done")
    async with serve(llm) as (_, client):
        r = await client.chat.completions.create(model=MODEL, messages=user("pick"), n=3, extra_body=TOKEN_IDS)
        assert [(c.index, c.message.content) for c in r.choices] == [(0, "alpha"), (1, "beta"), (2, "gamma")]
        assert r.usage.completion_tokens == sum(len(c.token_ids) for c in r.choices)
        # The script is used up: the rule stops matching and the default reply answers.
        r = await client.chat.completions.create(model=MODEL, messages=user("pick"))
        assert r.choices[0].message.content == "done"


async def test_max_tokens_truncates_with_length(client: openai.AsyncOpenAI) -> None:
    r = await client.chat.completions.create(model=MODEL, messages=user("count"), max_tokens=3, extra_body=TOKEN_IDS)
    c = r.choices[0]
    assert c.finish_reason == "length" and len(c.token_ids) == 3
    full = "one two three four five six seven eight nine ten"
    assert c.token_ids == TOK.encode(full)[:3]
    assert c.message.content == TOK.decode(c.token_ids) == "one two thre"
    assert r.usage.completion_tokens == 3


async def test_stop_strings(client: openai.AsyncOpenAI) -> None:
    r = await client.chat.completions.create(
        model=MODEL, messages=user("count"), stop=["four", "nine"], extra_body=TOKEN_IDS
    )
    c = r.choices[0]
    assert c.message.content == "one two three " and c.finish_reason == "stop"
    assert c.token_ids == TOK.encode(c.message.content)
    r = await client.completions.create(model=MODEL, prompt="count", stop="two", max_tokens=50)
    assert r.choices[0].text == "one " and r.choices[0].finish_reason == "stop"


async def test_eos_token_option() -> None:
    async with serve(FakeLLM(default_reply="Done.", eos_token=True)) as (_, client):
        r = await client.chat.completions.create(model=MODEL, messages=user("x"), logprobs=True, extra_body=TOKEN_IDS)
        c = r.choices[0]
        assert c.message.content == "Done." and c.token_ids == [*TOK.encode("Done."), IM_END]
        assert TOK.decode(c.token_ids, skip_special_tokens=True) == c.message.content
        assert [e.logprob for e in c.logprobs.content] == expected_logprobs(r.prompt_token_ids, c.token_ids)
        stream = await client.chat.completions.create(
            model=MODEL, messages=user("x"), stream=True, extra_body=TOKEN_IDS
        )
        chunks = [chunk async for chunk in stream]
        assert chunks[-1].choices[0].token_ids == [IM_END] and chunks[-1].choices[0].finish_reason == "stop"


# --------------------------------------------------------------------------------------------
# Recording, models, configuration
# --------------------------------------------------------------------------------------------


async def test_requests_are_recorded_with_forced_parameters() -> None:
    seen: list[FakeRequest] = []
    llm = FakeLLM(latency_s=lambda req: seen.append(req) or 0.0)
    async with serve(llm, api_key="secret", default_headers={"X-Agentbolt-Rollout-Id": "ro-1"}) as (server, client):
        await client.chat.completions.create(
            model="some-other-model", messages=user("hi"), temperature=0.7, top_p=0.9, seed=42
        )
        await client.models.list()
        assert [(r.method, r.path) for r in server.requests] == [
            ("POST", "/v1/chat/completions"),
            ("GET", "/v1/models"),
        ]
        first = server.requests[0]
        assert first.body["model"] == "some-other-model"
        assert (first.body["temperature"], first.body["top_p"], first.body["seed"]) == (0.7, 0.9, 42)
        assert first.headers["x-agentbolt-rollout-id"] == "ro-1"
        assert first.headers["authorization"] == "Bearer secret"
        assert seen[0].model == "some-other-model" and seen[0].text == "hi"
        server.requests.clear()
        assert len(server.requests) == 0


async def test_strict_model_answers_404() -> None:
    async with serve(FakeLLM(strict_model=True)) as (_, client):
        with pytest.raises(openai.NotFoundError) as info:
            await client.chat.completions.create(model="gpt-4o", messages=user("hi"))
        assert info.value.body["code"] == "model_not_found"
        r = await client.chat.completions.create(model=MODEL, messages=user("hi"))
        assert r.choices[0].message.content == DEFAULT_REPLY


def test_config_json_round_trip_and_callables_refused() -> None:
    llm = FakeLLM(
        rules=[Rule(match="w", reply=ToolCall("f", {"a": 1})), Rule(reply=["x", "y"])],
        failures=[Failure(kind="drop", times=2, match="(?i)boom")],
        model="m",
    )
    config = llm.to_config()
    assert FakeLLM.from_config(json.loads(json.dumps(config))).to_config() == config
    with pytest.raises(UserError):
        make_llm().to_config()  # holds a reply callable
    with pytest.raises(ValueError):
        FakeLLM(failures=[{"kind": "explode"}])


# --------------------------------------------------------------------------------------------
# Injected failures
# --------------------------------------------------------------------------------------------


async def test_status_failure_then_recovery() -> None:
    llm = FakeLLM(failures=[Failure(status=500, times=1)])
    async with serve(llm) as (_, client):
        with pytest.raises(openai.InternalServerError) as info:
            await client.chat.completions.create(model=MODEL, messages=user("hi"))
        assert info.value.status_code == 500
        assert set(info.value.body) >= {"message", "type", "code"} and info.value.body["type"] == "server_error"
        r = await client.chat.completions.create(model=MODEL, messages=user("hi"))
        assert r.choices[0].message.content == DEFAULT_REPLY
        llm.set_failures([Failure(status=429, times=2)])
        for _ in range(2):
            with pytest.raises(openai.RateLimitError):
                await client.chat.completions.create(model=MODEL, messages=user("hi"))
        await client.chat.completions.create(model=MODEL, messages=user("hi"))
        llm.reset()  # counters start afresh, the log is emptied
        assert len(llm.requests) == 0
        with pytest.raises(openai.RateLimitError):
            await client.chat.completions.create(model=MODEL, messages=user("hi"))


async def test_failing_reply_callable_answers_500() -> None:
    async with serve(FakeLLM(default_reply=lambda req: 1 / 0)) as (_, client):
        with pytest.raises(openai.InternalServerError, match="ZeroDivisionError"):
            await client.chat.completions.create(model=MODEL, messages=user("hi"))


async def test_latency_and_per_token_delay_keep_the_answer() -> None:
    async with serve(make_llm(latency_s=0.01, token_latency_s=0.001)) as (_, client):
        kwargs: dict[str, Any] = {"model": MODEL, "messages": user("count"), "n": 2, "extra_body": TOKEN_IDS}
        full = await client.chat.completions.create(**kwargs)
        stream = await client.chat.completions.create(**kwargs, stream=True)
        text, ids = ["", ""], [[], []]
        async for chunk in stream:
            for c in chunk.choices:
                text[c.index] += c.delta.content or ""
                ids[c.index] += c.token_ids
        assert text == [c.message.content for c in full.choices]
        assert ids == [c.token_ids for c in full.choices]


async def test_failures_target_by_match_and_surface_as_openai_errors() -> None:
    llm = FakeLLM(
        failures=[
            Failure(kind="status", status=503, match="busy"),
            Failure(kind="timeout", hang_s=60, match="hang"),
            Failure(kind="drop", match="drop"),
            Failure(kind="drop_mid_stream", after_chunks=2, match="cut"),
        ]
    )
    async with serve(llm, timeout=0.5) as (_, client):

        async def ask(text: str, stream: bool = False) -> Any:
            r = await client.chat.completions.create(model=MODEL, messages=user(text), stream=stream)
            return [c async for c in r] if stream else r

        with pytest.raises(openai.InternalServerError):
            await ask("busy")
        with pytest.raises(openai.APITimeoutError):
            await ask("hang")
        for stream in (False, True):
            with pytest.raises(openai.APIConnectionError) as info:
                await ask("drop", stream)
            assert not isinstance(info.value, openai.APITimeoutError)
            with pytest.raises(openai.APIConnectionError):
                await ask("cut", stream)
        assert (await ask("fine")).choices[0].message.content == DEFAULT_REPLY


class _SyncASGI:
    """Calls the bare ASGI app through httpx.ASGITransport from sync code (no sockets)."""

    def __init__(self, app: FakeLLMApp) -> None:
        self._loop = asyncio.new_event_loop()
        self._client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://fake/")

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return self._loop.run_until_complete(self._client.post(path, **kwargs))

    def __enter__(self) -> _SyncASGI:
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.run_until_complete(self._client.aclose())
        self._loop.close()


def test_probability_failures_are_seeded() -> None:
    def outcomes() -> list[int]:
        with _SyncASGI(FakeLLMApp(FakeLLM(failures=[Failure(status=502, probability=0.5, seed=7)]))) as http:
            return [http.post("/v1/completions", json={"prompt": "p"}).status_code for _ in range(40)]

    first = outcomes()
    assert first == outcomes()
    assert set(first) == {200, 502}


# --------------------------------------------------------------------------------------------
# Without sockets, and as a subprocess
# --------------------------------------------------------------------------------------------


async def test_bare_asgi_app_over_asgi_transport() -> None:
    llm = make_llm(failures=[Failure(kind="drop", match="drop")])
    transport = httpx.ASGITransport(app=FakeLLMApp(llm))
    async with httpx.AsyncClient(transport=transport, base_url="http://fake/v1/") as http:
        r = await http.post("chat/completions", json={"model": MODEL, "messages": user("Sunny"), **TOKEN_IDS})
        assert r.status_code == 200
        assert r.json()["choices"][0]["token_ids"] == TOK.encode("It is sunny in Paris today.")
        r = await http.post("chat/completions", content=b"{not json")
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
        r = await http.post("chat/completions", json={"model": MODEL, "messages": []})
        assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
        r = await http.get("nope")
        assert r.status_code == 404 and "error" in r.json()
        with pytest.raises(ConnectionResetError):  # no socket to close: the drop reaches the client as an error
            await http.post("chat/completions", json={"model": MODEL, "messages": user("drop")})


def test_subprocess_server() -> None:
    llm = FakeLLM(
        rules=[Rule(match="hi", reply="hello from the subprocess")], failures=[Failure(match="fail", times=1)]
    )
    with FakeLLMProcess(llm) as proc, openai.OpenAI(base_url=proc.base_url, api_key="x", max_retries=0) as client:
        assert proc.base_url.startswith("http://127.0.0.1:") and proc.base_url.endswith("/v1")
        r = client.chat.completions.create(model=MODEL, messages=user("hi"), extra_body=TOKEN_IDS)
        assert r.choices[0].message.content == "hello from the subprocess"
        assert r.choices[0].token_ids == TOK.encode("hello from the subprocess")
        with pytest.raises(openai.InternalServerError):
            client.chat.completions.create(model=MODEL, messages=user("fail"))
        assert [r.body["messages"][-1]["content"] for r in proc.requests] == ["hi", "fail"]
        proc.requests.clear()
        assert len(proc.requests) == 0
        pid = proc.pid
    assert proc.pid is None and pid is not None


@pytest.mark.slow
def test_subprocess_with_workers_from_a_config_file(tmp_path: Any) -> None:
    config = tmp_path / "fake.json"
    config.write_text(json.dumps({"rules": [{"match": "hi", "reply": "hello"}], "model": "served"}))
    with FakeLLMProcess(config, workers=2) as proc, openai.OpenAI(base_url=proc.base_url, api_key="x") as client:
        assert [m.id for m in client.models.list()] == ["served"]
        replies = {
            client.chat.completions.create(model="served", messages=user("hi")).choices[0].message.content
            for _ in range(8)
        }
        assert replies == {"hello"}
