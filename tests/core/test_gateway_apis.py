"""/v1/responses and /v1/messages through the gateway, with the real openai and anthropic clients,
against the fake backend: each call is one span with the upstream's exact token ids."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

import anthropic
import openai
import pytest
import pytest_asyncio

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.gateway import Gateway
from agentbolt.gateway.messages_api import to_chat as messages_to_chat
from agentbolt.gateway.responses_api import to_chat as responses_to_chat
from agentbolt.gateway.translate import TranslationError
from agentbolt.store import Store, open_store
from agentbolt.testing.fake_llm import FakeLLM, FakeLLMServer, FakeTokenizer, Rule, ToolCall, ToolCalls

TOK = FakeTokenizer()
WEATHER = ToolCalls([ToolCall("get_weather", {"city": "Paris"})])


@dataclass
class Env:
    store: Store
    backend: FakeLLM
    gateway: Gateway
    rollout_id: str
    attempt_id: str

    @property
    def base(self) -> str:
        return self.gateway.base_url_for(self.rollout_id, self.attempt_id)

    def openai(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.base, api_key="k", max_retries=0)

    def anthropic(self) -> anthropic.AsyncAnthropic:
        return anthropic.AsyncAnthropic(base_url=self.base.removesuffix("/v1"), api_key="k", max_retries=0)

    async def spans(self) -> list[t.Span]:
        await self.gateway.flush()
        spans = (await self.store.query_spans([self.rollout_id]))[self.rollout_id]
        return [s for s in spans if s.attributes.get(semconv.SPAN_KIND_ATTR) == semconv.KIND_LLM]


@pytest_asyncio.fixture
async def env() -> AsyncIterator[Env]:
    store = open_store("memory://")
    await store.enqueue([t.RolloutSpec(rollout_id="r1")])
    (claim,) = await store.dequeue("w")
    backend = FakeLLM(
        default_reply="The answer is 42.", rules=[Rule(match="weather", reply=[WEATHER])]
    )  # once, then the default
    async with FakeLLMServer(backend) as server:
        gateway = Gateway(store, [server.base_url])
        await gateway.start()
        yield Env(store, backend, gateway, "r1", claim.attempt.attempt_id)
        await gateway.stop()
    await store.close()


def assert_exact(span: t.Span, messages: list[dict], reply_ids: list[int], api: str) -> None:
    a = span.attributes
    assert a[semconv.TOKEN_SOURCE] == semconv.TOKEN_SOURCE_EXACT
    assert a[semconv.LLM_API] == api
    assert a[semconv.PROMPT_TOKEN_IDS] == TOK.render_chat(messages)
    assert a[semconv.RESPONSE_TOKEN_IDS] == reply_ids
    assert a[semconv.RESPONSE_LOGPROBS] == TOK.expected_logprobs(a[semconv.PROMPT_TOKEN_IDS], reply_ids)


@pytest.mark.parametrize("stream", [False, True])
async def test_responses_text(env: Env, stream: bool) -> None:
    client = env.openai()
    kwargs = {"model": "m", "instructions": "Be brief.", "input": "What is 6 times 7?"}
    if stream:
        async with client.responses.stream(**kwargs) as s:
            deltas = [e.delta async for e in s if e.type == "response.output_text.delta"]
            resp = await s.get_final_response()
        assert "".join(deltas) == "The answer is 42."
    else:
        resp = await client.responses.create(**kwargs)
    assert resp.output_text == "The answer is 42."
    assert resp.status == "completed"
    (span,) = await env.spans()
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 6 times 7?"}]
    assert resp.usage.input_tokens == len(TOK.render_chat(messages))
    assert_exact(span, messages, TOK.encode("The answer is 42."), "responses")
    assert span.attributes[semconv.GEN_AI_RESPONSE_ID] == resp.id


@pytest.mark.parametrize("stream", [False, True])
async def test_responses_function_call_round_trip(env: Env, stream: bool) -> None:
    client = env.openai()
    tools = [
        {
            "type": "function",
            "name": "get_weather",
            "description": "Weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        }
    ]
    inputs: list = [{"role": "user", "content": "What is the weather in Paris?"}]
    if stream:
        async with client.responses.stream(model="m", input=inputs, tools=tools) as s:
            async for _ in s:
                pass
            first = await s.get_final_response()
    else:
        first = await client.responses.create(model="m", input=inputs, tools=tools)
    (call,) = [o for o in first.output if o.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    inputs += [
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
    ]
    second = await client.responses.create(model="m", input=inputs, tools=tools)
    assert second.output_text == "The answer is 42."
    s1, s2 = await env.spans()
    assert s1.attributes[semconv.TOKEN_SOURCE] == s2.attributes[semconv.TOKEN_SOURCE] == semconv.TOKEN_SOURCE_EXACT
    forwarded = json.loads(s2.attributes[semconv.GEN_AI_INPUT_MESSAGES])
    assert forwarded[1]["tool_calls"][0]["id"] == call.call_id
    assert forwarded[2] == {"role": "tool", "tool_call_id": call.call_id, "content": "sunny"}
    # the second prompt extends the first prompt and reply: the trajectory can merge
    p1, r1 = s1.attributes[semconv.PROMPT_TOKEN_IDS], s1.attributes[semconv.RESPONSE_TOKEN_IDS]
    assert s2.attributes[semconv.PROMPT_TOKEN_IDS][: len(p1) + len(r1)] == p1 + r1


@pytest.mark.parametrize("stream", [False, True])
async def test_messages_text(env: Env, stream: bool) -> None:
    client = env.anthropic()
    kwargs = {
        "model": "m",
        "max_tokens": 64,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "What is 6 times 7?"}],
    }
    if stream:
        async with client.messages.stream(**kwargs) as s:
            text = "".join([x async for x in s.text_stream])
            msg = await s.get_final_message()
        assert text == "The answer is 42."
    else:
        msg = await client.messages.create(**kwargs)
    assert msg.content[0].text == "The answer is 42."
    assert msg.stop_reason == "end_turn"
    (span,) = await env.spans()
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 6 times 7?"}]
    assert msg.usage.input_tokens == len(TOK.render_chat(messages))
    assert msg.usage.output_tokens == len(TOK.encode("The answer is 42."))
    assert_exact(span, messages, TOK.encode("The answer is 42."), "messages")
    assert span.attributes[semconv.GEN_AI_RESPONSE_ID] == msg.id


@pytest.mark.parametrize("stream", [False, True])
async def test_messages_tool_use_round_trip(env: Env, stream: bool) -> None:
    client = env.anthropic()
    tools = [
        {
            "name": "get_weather",
            "description": "Weather of a city",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
        }
    ]
    messages: list = [{"role": "user", "content": "What is the weather in Paris?"}]
    if stream:
        async with client.messages.stream(model="m", max_tokens=64, messages=messages, tools=tools) as s:
            first = await s.get_final_message()
    else:
        first = await client.messages.create(model="m", max_tokens=64, messages=messages, tools=tools)
    assert first.stop_reason == "tool_use"
    (use,) = [b for b in first.content if b.type == "tool_use"]
    assert use.name == "get_weather" and use.input == {"city": "Paris"}
    messages += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}]},
    ]
    second = await client.messages.create(model="m", max_tokens=64, messages=messages, tools=tools)
    assert second.content[0].text == "The answer is 42."
    s1, s2 = await env.spans()
    assert s2.attributes[semconv.TOKEN_SOURCE] == semconv.TOKEN_SOURCE_EXACT
    p1, r1 = s1.attributes[semconv.PROMPT_TOKEN_IDS], s1.attributes[semconv.RESPONSE_TOKEN_IDS]
    assert s2.attributes[semconv.PROMPT_TOKEN_IDS][: len(p1) + len(r1)] == p1 + r1


async def test_untranslatable_requests_get_400_with_the_reason(env: Env) -> None:
    client = env.openai()
    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        await client.responses.create(model="m", input="hi", previous_response_id="resp_1")
    with pytest.raises(openai.BadRequestError, match="hosted tool"):
        await client.responses.create(model="m", input="hi", tools=[{"type": "web_search"}])
    with pytest.raises(anthropic.BadRequestError, match="server tool"):
        await env.anthropic().messages.create(
            model="m",
            max_tokens=8,
            messages=[{"role": "user", "content": "hi"}],
            tools=[{"type": "web_search_20250305", "name": "web_search"}],
        )
    assert await env.spans() == []


def test_translations_of_instructions_and_developer_messages() -> None:
    chat = responses_to_chat(
        {
            "model": "m",
            "instructions": "sys",
            "input": [
                {"role": "developer", "content": [{"type": "input_text", "text": "dev"}]},
                {"role": "user", "content": "hi"},
                {"type": "reasoning", "summary": []},
            ],
            "max_output_tokens": 5,
            "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
        }
    )
    assert chat["messages"] == [
        {"role": "system", "content": "sys"},
        {"role": "system", "content": "dev"},
        {"role": "user", "content": "hi"},
    ]
    assert chat["max_tokens"] == 5
    assert chat["response_format"]["json_schema"]["name"] == "x"
    chat = messages_to_chat(
        {
            "model": "m",
            "system": [{"type": "text", "text": "sys"}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
            "stop_sequences": ["END"],
        }
    )
    assert chat["messages"] == [{"role": "system", "content": "sys"}, {"role": "user", "content": "ab"}]
    assert chat["tool_choice"] == "required" and chat["parallel_tool_calls"] is False and chat["stop"] == ["END"]
    with pytest.raises(TranslationError, match="document"):
        messages_to_chat({"messages": [{"role": "user", "content": [{"type": "document"}]}]})


async def test_anthropic_clients_authenticate_with_x_api_key() -> None:
    store = open_store("memory://")
    await store.enqueue([t.RolloutSpec(rollout_id="r1")])
    (claim,) = await store.dequeue("w")
    async with FakeLLMServer(FakeLLM(default_reply="ok")) as server:
        gateway = Gateway(store, [server.base_url], token="secret")
        await gateway.start()
        base = gateway.base_url_for("r1", claim.attempt.attempt_id).removesuffix("/v1")
        try:
            ok = anthropic.AsyncAnthropic(base_url=base, api_key="secret", max_retries=0)
            msg = await ok.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
            assert msg.content[0].text == "ok"
            wrong = anthropic.AsyncAnthropic(base_url=base, api_key="nope", max_retries=0)
            with pytest.raises(anthropic.AuthenticationError):
                await wrong.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
        finally:
            await gateway.stop()
    await store.close()
