"""The gateway against the fake OpenAI backend, through the real openai client."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import openai
import pytest
import pytest_asyncio

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.errors import UserError
from agentbolt.gateway import UPSTREAM_ERROR, Gateway, GatewayClient, GatewayControlError, GatewayThread, Upstream
from agentbolt.store import Store, open_store
from agentbolt.testing.fake_llm import Failure, FakeLLM, FakeLLMServer, FakeTokenizer, Rule, ToolCall, ToolCalls

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 6 times 7?"}]
TOK = FakeTokenizer()


@dataclass
class Env:
    store: Store
    backend: FakeLLM
    server: FakeLLMServer
    gateway: Gateway
    rollout_id: str
    attempt_id: str

    def client(self, **kw: object) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=self.gateway.base_url_for(self.rollout_id, self.attempt_id), api_key="k", max_retries=0, **kw
        )

    async def spans(self) -> list[t.Span]:
        await self.gateway.flush()
        return [
            s
            for s in (await self.store.query_spans([self.rollout_id]))[self.rollout_id]
            if s.attributes.get(semconv.SPAN_KIND_ATTR) == semconv.KIND_LLM
        ]


async def make_env(backend: FakeLLM | None = None, **gateway_kw: object) -> tuple[Env, list[object]]:
    store = open_store("memory://")
    await store.enqueue([t.RolloutSpec(rollout_id="ro/1 x")])  # a rollout id that needs URL encoding
    (claim,) = await store.dequeue("w")
    backend = backend or FakeLLM(default_reply="The answer is 42.")
    server = FakeLLMServer(backend)
    await server.__aenter__()
    gateway = Gateway(store, [server.base_url], **gateway_kw)  # type: ignore[arg-type]
    await gateway.start()
    env = Env(store, backend, server, gateway, "ro/1 x", claim.attempt.attempt_id)
    return env, [gateway, server, store]


@pytest_asyncio.fixture
async def env() -> AsyncIterator[Env]:
    e, _ = await make_env()
    yield e
    await e.gateway.stop()
    await e.server.__aexit__(None, None, None)
    await e.store.close()


async def close(env: Env) -> None:
    await env.gateway.stop()
    await env.server.__aexit__(None, None, None)
    await env.store.close()


async def test_chat_call_records_exact_token_ids(env: Env) -> None:
    raw = await env.client().chat.completions.with_raw_response.create(model="m", messages=MESSAGES)
    resp = raw.parse()
    (span,) = await env.spans()
    a = span.attributes
    prompt_ids = TOK.render_chat(MESSAGES)
    response_ids = TOK.encode(resp.choices[0].message.content or "")
    assert a[semconv.PROMPT_TOKEN_IDS] == prompt_ids
    assert a[semconv.RESPONSE_TOKEN_IDS] == response_ids
    assert a[semconv.RESPONSE_LOGPROBS] == pytest.approx(TOK.expected_logprobs(prompt_ids, response_ids))
    assert a[semconv.TOKEN_SOURCE] == "exact"
    assert a[semconv.GEN_AI_RESPONSE_ID] == resp.id  # adapters join on this
    assert raw.headers["x-agentbolt-span-id"] == span.span_id
    assert a[semconv.GEN_AI_RESPONSE_FINISH_REASONS] == ["stop"]
    assert a[semconv.GEN_AI_USAGE_INPUT_TOKENS] == len(prompt_ids)
    assert a[semconv.GEN_AI_OPERATION_NAME] == "chat" and a[semconv.LLM_STREAM] is False
    assert json.loads(a[semconv.GEN_AI_INPUT_MESSAGES]) == MESSAGES
    assert json.loads(a[semconv.GEN_AI_OUTPUT_MESSAGES])[0]["content"] == "The answer is 42."
    assert span.rollout_id == env.rollout_id and span.attempt_id == env.attempt_id
    assert span.status.code is t.StatusCode.UNSET and span.end_time_ns >= span.start_time_ns  # type: ignore[operator]
    # The upstream was asked for ids and logprobs.
    forwarded = env.backend.requests[-1].body
    assert forwarded["return_token_ids"] is True and forwarded["logprobs"] is True


async def test_completions_call(env: Env) -> None:
    resp = await env.client().completions.create(model="m", prompt="2 + 2 =", max_tokens=3)
    (span,) = await env.spans()
    a = span.attributes
    assert a[semconv.GEN_AI_OPERATION_NAME] == "text_completion"
    assert a[semconv.PROMPT_TOKEN_IDS] == TOK.encode("2 + 2 =")
    assert a[semconv.RESPONSE_TOKEN_IDS] == TOK.encode(resp.choices[0].text)
    assert len(a[semconv.RESPONSE_LOGPROBS]) == len(a[semconv.RESPONSE_TOKEN_IDS])
    assert a[semconv.GEN_AI_RESPONSE_FINISH_REASONS] == ["length"]


async def test_streaming_is_passed_through_and_assembled(env: Env) -> None:
    stream = await env.client().chat.completions.create(model="m", messages=MESSAGES, stream=True)
    pieces = [
        chunk.choices[0].delta.content async for chunk in stream if chunk.choices and chunk.choices[0].delta.content
    ]
    assert len(pieces) > 3 and "".join(pieces) == "The answer is 42."
    (span,) = await env.spans()
    a = span.attributes
    prompt_ids = TOK.render_chat(MESSAGES)
    assert a[semconv.LLM_STREAM] is True
    assert a[semconv.PROMPT_TOKEN_IDS] == prompt_ids
    assert a[semconv.RESPONSE_TOKEN_IDS] == TOK.encode("The answer is 42.")
    assert a[semconv.RESPONSE_LOGPROBS] == pytest.approx(
        TOK.expected_logprobs(prompt_ids, a[semconv.RESPONSE_TOKEN_IDS])
    )
    assert a[semconv.GEN_AI_RESPONSE_ID].startswith("chatcmpl-")
    assert json.loads(a[semconv.GEN_AI_OUTPUT_MESSAGES])[0]["content"] == "The answer is 42."


async def test_tool_calls_are_recorded() -> None:
    backend = FakeLLM(
        rules=[Rule(match="weather", reply=ToolCalls([ToolCall("get_weather", {"city": "Paris"}, id="call_1")]))]
    )
    env, _ = await make_env(backend)
    try:
        tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
        resp = await env.client().chat.completions.create(
            model="m", messages=[{"role": "user", "content": "weather in Paris?"}], tools=tools
        )
        assert resp.choices[0].message.tool_calls[0].function.name == "get_weather"  # type: ignore[index]
        (span,) = await env.spans()
        body = json.loads(span.attributes[semconv.LLM_RESPONSE])
        assert body["choices"][0]["message"]["tool_calls"][0]["id"] == "call_1"
        assert span.attributes[semconv.GEN_AI_RESPONSE_FINISH_REASONS] == ["tool_calls"]
        assert span.attributes[semconv.TOKEN_SOURCE] == "exact"
    finally:
        await close(env)


async def test_header_routing(env: Env) -> None:
    client = openai.AsyncOpenAI(
        base_url=f"{env.gateway.url}/v1",
        api_key="k",
        max_retries=0,
        default_headers={"X-Agentbolt-Rollout-Id": env.rollout_id, "X-Agentbolt-Attempt-Id": env.attempt_id},
    )
    await client.chat.completions.create(model="m", messages=MESSAGES)
    assert len(await env.spans()) == 1
    bare = openai.AsyncOpenAI(base_url=f"{env.gateway.url}/v1", api_key="k", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="which rollout"):
        await bare.chat.completions.create(model="m", messages=MESSAGES)


async def test_forced_model_and_sampling() -> None:
    env, _ = await make_env(served_model="policy-v1", sampling={"temperature": 1.0, "top_p": 0.9})
    try:
        await env.client().chat.completions.create(model="gpt-whatever", messages=MESSAGES, temperature=0.1)
        forwarded = env.backend.requests[-1].body
        assert forwarded["model"] == "policy-v1" and forwarded["temperature"] == 1.0 and forwarded["top_p"] == 0.9
        env.gateway.set_policy(version=7, sampling={"temperature": 0.5})
        await env.client().chat.completions.create(model="x", messages=MESSAGES)
        assert env.backend.requests[-1].body["temperature"] == 0.5
        spans = await env.spans()
        assert [s.attributes.get(semconv.POLICY_VERSION) for s in spans] == [None, 7]
        assert spans[0].attributes[semconv.GEN_AI_REQUEST_MODEL] == "policy-v1"
        models = await env.client().models.list()
        assert [m.id for m in models.data] == ["policy-v1"]
    finally:
        await close(env)


async def test_unknown_and_ended_attempts_are_rejected() -> None:
    env, _ = await make_env(attempt_ttl_s=0.0)
    try:
        ghost = openai.AsyncOpenAI(base_url=env.gateway.base_url_for("nope", "nope"), api_key="k", max_retries=0)
        with pytest.raises(openai.NotFoundError) as info:
            await ghost.chat.completions.create(model="m", messages=MESSAGES)
        assert info.value.body["type"] == "agentbolt_unknown_attempt"  # type: ignore[index]
        await env.client().chat.completions.create(model="m", messages=MESSAGES)
        await env.store.finish_attempt(env.attempt_id, t.AttemptStatus.SUCCEEDED, reward=1.0)
        with pytest.raises(openai.ConflictError, match="has ended"):
            await env.client().chat.completions.create(model="m", messages=MESSAGES)
        assert len(await env.spans()) == 1  # the rejected call reached no upstream and left no LLM span
        assert len(env.backend.requests) == 1
    finally:
        await close(env)


@pytest.mark.parametrize(
    ("failure", "status", "code"),
    [
        (Failure(kind="status", status=500), 502, "upstream_status_500"),
        (Failure(kind="drop"), 502, "upstream_unreachable"),
        (Failure(kind="timeout", hang_s=5.0), 504, "upstream_timeout"),
    ],
)
async def test_upstream_failures_become_errors_and_error_spans(failure: Failure, status: int, code: str) -> None:
    env, _ = await make_env(FakeLLM(failures=[failure]), request_timeout_s=0.5)
    try:
        with pytest.raises(openai.APIStatusError) as info:
            await env.client(timeout=30).chat.completions.create(model="m", messages=MESSAGES)
        assert info.value.status_code == status
        assert info.value.body["type"] == UPSTREAM_ERROR and info.value.body["code"] == code  # type: ignore[index]
        (span,) = await env.spans()
        assert span.status.code is t.StatusCode.ERROR
        assert span.attributes[semconv.ERROR_TYPE] == UPSTREAM_ERROR
        assert span.attributes["agentbolt.llm.upstream_error"] == code
        assert span.attributes[semconv.TOKEN_SOURCE] == "missing"
    finally:
        await close(env)


async def test_stream_dropped_mid_way() -> None:
    env, _ = await make_env(FakeLLM(failures=[Failure(kind="drop_mid_stream", after_chunks=3)]))
    try:

        async def consume() -> None:
            stream = await env.client().chat.completions.create(model="m", messages=MESSAGES, stream=True)
            async for _ in stream:
                pass

        with pytest.raises(openai.APIError):
            await consume()
        (span,) = await env.spans()
        assert span.status.code is t.StatusCode.ERROR and span.attributes[semconv.LLM_STREAM] is True
    finally:
        await close(env)


async def test_client_errors_pass_through() -> None:
    env, _ = await make_env(FakeLLM(failures=[Failure(kind="status", status=400, message="context too long")]))
    try:
        with pytest.raises(openai.BadRequestError, match="context too long"):
            await env.client().chat.completions.create(model="m", messages=MESSAGES)
        (span,) = await env.spans()
        assert span.status.code is t.StatusCode.ERROR and span.attributes[semconv.ERROR_TYPE] == "http_400"
    finally:
        await close(env)


async def test_pause_waits_then_resume_releases(env: Env) -> None:
    env.gateway.pause()
    call = asyncio.create_task(env.client().chat.completions.create(model="m", messages=MESSAGES))
    await asyncio.sleep(0.3)
    assert not call.done() and len(env.backend.requests) == 0
    env.gateway.resume()
    resp = await asyncio.wait_for(call, 10)
    assert resp.choices[0].message.content == "The answer is 42."


async def test_pause_bound_gives_503_with_retry_after() -> None:
    env, _ = await make_env(pause_timeout_s=0.2)
    try:
        env.gateway.pause()
        with pytest.raises(openai.APIStatusError) as info:
            await env.client().chat.completions.create(model="m", messages=MESSAGES)
        assert info.value.status_code == 503 and info.value.response.headers["retry-after"] == "1"
        assert info.value.body["type"] == "agentbolt_paused"  # type: ignore[index]
    finally:
        await close(env)


async def test_drain_waits_for_in_flight_calls() -> None:
    env, _ = await make_env(FakeLLM(latency_s=1.0))
    try:
        call = asyncio.create_task(env.client().chat.completions.create(model="m", messages=MESSAGES))
        for _ in range(500):  # until the call is upstream (a fixed sleep races on a loaded machine)
            if len(env.backend.requests):
                break
            await asyncio.sleep(0.01)
        assert not call.done(), "the call finished before the gateway was paused; raise latency_s"
        env.gateway.pause()
        assert await env.gateway.drain(timeout=10) is True
        assert call.done() and call.result().choices[0].message.content
    finally:
        await close(env)


async def test_bearer_token() -> None:
    env, _ = await make_env(token="s3cret")
    try:
        with pytest.raises(openai.AuthenticationError):
            await env.client().chat.completions.create(model="m", messages=MESSAGES)
        ok = openai.AsyncOpenAI(
            base_url=env.gateway.base_url_for(env.rollout_id, env.attempt_id), api_key="s3cret", max_retries=0
        )
        await ok.chat.completions.create(model="m", messages=MESSAGES)
        forwarded = {k.lower(): v for k, v in env.backend.requests[-1].headers.items()}
        assert forwarded.get("authorization") != "Bearer s3cret"  # the client's key never goes upstream
    finally:
        await close(env)
    with pytest.raises(UserError, match="without a token"):
        await Gateway(open_store("memory://"), ["http://127.0.0.1:1/v1"]).start(host="0.0.0.0")


async def test_upstream_key_replaces_client_key() -> None:
    backend = FakeLLM()
    async with FakeLLMServer(backend) as server:
        store = open_store("memory://")
        await store.enqueue([t.RolloutSpec(rollout_id="r")])
        (claim,) = await store.dequeue("w")
        gateway = Gateway(store, [Upstream(base_url=server.base_url, api_key="upstream-key")])
        await gateway.start()
        client = openai.AsyncOpenAI(
            base_url=gateway.base_url_for("r", claim.attempt.attempt_id), api_key="agent-key", max_retries=0
        )
        await client.chat.completions.create(model="m", messages=MESSAGES)
        headers = {k.lower(): v for k, v in backend.requests[-1].headers.items()}
        assert headers["authorization"] == "Bearer upstream-key"
        await gateway.stop()


async def test_concurrent_rollouts_do_not_mix() -> None:
    backend = FakeLLM(default_reply=lambda req: f"echo {req.text}", latency_s=0.02)
    async with FakeLLMServer(backend) as server:
        store = open_store("memory://")
        await store.enqueue([t.RolloutSpec(rollout_id=f"r{i}") for i in range(10)])
        claims = {c.rollout.rollout_id: c.attempt.attempt_id for c in await store.dequeue("w", limit=10)}
        gateway = Gateway(store, [server.base_url])
        await gateway.start()

        async def call(rid: str, k: int) -> str:
            client = openai.AsyncOpenAI(base_url=gateway.base_url_for(rid, claims[rid]), api_key="k", max_retries=0)
            resp = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": f"{rid} call {k}"}]
            )
            return resp.id

        ids = await asyncio.gather(*(call(f"r{i}", k) for i in range(10) for k in range(5)))
        await gateway.flush()
        spans = await store.query_spans(list(claims))
        for rid, span_list in spans.items():
            assert len(span_list) == 5
            for s in span_list:
                assert rid in json.loads(s.attributes[semconv.GEN_AI_INPUT_MESSAGES])[0]["content"]
                assert s.attempt_id == claims[rid]
        assert {s.attributes[semconv.GEN_AI_RESPONSE_ID] for v in spans.values() for s in v} == set(ids)
        await gateway.stop()


async def test_bad_requests(env: Env) -> None:
    base = env.gateway.base_url_for(env.rollout_id, env.attempt_id)
    async with httpx.AsyncClient() as http:
        bad_json = await http.post(
            f"{base}/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
        )
        assert bad_json.status_code == 400 and "not valid JSON" in bad_json.json()["error"]["message"]
        not_object = await http.post(f"{base}/chat/completions", json=[1, 2])
        assert not_object.status_code == 400
        wrong_method = await http.get(f"{base}/chat/completions")
        assert wrong_method.status_code == 405
        unknown = await http.post(f"{env.gateway.url}/whatever")
        assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "invalid_request_error"
        health = await http.get(f"{env.gateway.url}/gateway/health")
        assert health.json() == {"status": "ok", "paused": False, "ready": True}
    assert len(env.backend.requests) == 0


async def test_no_upstream_yet_is_a_503() -> None:
    store = open_store("memory://")
    await store.enqueue([t.RolloutSpec(rollout_id="r")])
    (claim,) = await store.dequeue("w")
    gateway = Gateway(store, [])
    await gateway.start()
    client = openai.AsyncOpenAI(
        base_url=gateway.base_url_for("r", claim.attempt.attempt_id), api_key="k", max_retries=0
    )
    with pytest.raises(openai.APIStatusError) as info:
        await client.chat.completions.create(model="m", messages=MESSAGES)
    assert info.value.status_code == 503 and info.value.body["type"] == UPSTREAM_ERROR  # type: ignore[index]
    await gateway.stop()


async def test_missing_and_retokenized_ids() -> None:
    env, _ = await make_env(request_token_ids=False)
    try:
        await env.client().chat.completions.create(model="m", messages=MESSAGES)
        (span,) = await env.spans()
        assert span.attributes[semconv.TOKEN_SOURCE] == "missing"
        assert semconv.PROMPT_TOKEN_IDS not in span.attributes
    finally:
        await close(env)

    def retok(request: object, response: dict) -> tuple[list[int], list[int]]:
        return TOK.render_chat(request["messages"]), TOK.encode(response["choices"][0]["message"]["content"])  # type: ignore[index]

    env, _ = await make_env(request_token_ids=False, retokenize=retok)
    try:
        await env.client().chat.completions.create(model="m", messages=MESSAGES)
        (span,) = await env.spans()
        assert span.attributes[semconv.TOKEN_SOURCE] == "retokenized"
        assert span.attributes[semconv.PROMPT_TOKEN_IDS] == TOK.render_chat(MESSAGES)
    finally:
        await close(env)


async def test_agent_name_header(env: Env) -> None:
    await env.client(default_headers={"X-Agentbolt-Agent-Name": "writer"}).chat.completions.create(
        model="m", messages=MESSAGES
    )
    (span,) = await env.spans()
    assert span.attributes[semconv.GEN_AI_AGENT_NAME] == "writer"


async def test_traceparent_links_the_span_to_the_agents_trace(env: Env) -> None:
    trace_id, parent = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    client = env.client(default_headers={"traceparent": f"00-{trace_id}-{parent}-01"})
    await client.chat.completions.create(model="m", messages=MESSAGES)
    (span,) = await env.spans()
    assert (span.trace_id, span.parent_span_id) == (trace_id, parent)


async def test_control_endpoints_over_http() -> None:
    env, _ = await make_env(token="tok")
    try:
        async with httpx.AsyncClient(base_url=env.gateway.url) as http:
            assert (await http.post("/gateway/pause")).status_code == 401
            auth = {"authorization": "Bearer tok"}
            paused = await http.post("/gateway/pause", headers=auth)
            assert paused.json()["paused"] is True and env.gateway.paused
            await http.post("/gateway/resume", headers=auth)
            assert not env.gateway.paused
            policy = await http.post(
                "/gateway/policy", headers=auth, json={"version": 3, "sampling": {"temperature": 0.2}}
            )
            assert policy.json()["policy_version"] == 3 and env.gateway.sampling == {"temperature": 0.2}
            assert (await http.post("/gateway/drain", headers=auth, json={"timeout": 1})).json() == {"drained": True}
    finally:
        await close(env)


def test_gateway_thread_from_sync_code(tmp_path: object) -> None:
    backend = FakeLLM(default_reply="hi")
    with FakeLLMServer(backend) as server:
        url = f"sqlite:///{tmp_path}/gw.db"

        async def prepare() -> str:
            store = open_store(url)
            await store.enqueue([t.RolloutSpec(rollout_id="r")])
            (claim,) = await store.dequeue("w")
            await store.close()
            return claim.attempt.attempt_id

        aid = asyncio.run(prepare())
        with GatewayThread(url, [server.base_url]) as gw:
            client = openai.OpenAI(base_url=gw.base_url_for("r", aid), api_key="k", max_retries=0)
            assert client.chat.completions.create(model="m", messages=MESSAGES).choices[0].message.content == "hi"
            gw.pause()
            assert gw.stats()["paused"] is True
            gw.resume()
            gw.flush()

        async def count() -> int:
            store = open_store(url)
            spans = (await store.query_spans(["r"]))["r"]
            await store.close()
            return len(spans)

        assert asyncio.run(count()) == 1


async def test_gateway_client_drives_the_control_routes() -> None:
    env, _ = await make_env(token="tok")
    try:
        with pytest.raises(GatewayControlError, match="401"):
            await GatewayClient(env.gateway.url).pause()  # no token
        async with GatewayClient(env.gateway.url + "/v1", token="tok") as gw:  # the agents' URL works too
            assert (await gw.health()) == {"status": "ok", "paused": False, "ready": True}
            await gw.set_upstreams([env.server.base_url, Upstream(base_url=env.server.base_url, model="m2")])
            assert (await gw.stats())["upstreams"] == [env.server.base_url] * 2
            await gw.pause()
            assert env.gateway.paused
            assert await gw.drain(timeout=1) is True
            await gw.set_policy(version=5, sampling={"temperature": 0.5})
            await gw.resume()
            assert not env.gateway.paused and env.gateway.policy_version == 5
            client = openai.AsyncOpenAI(
                base_url=env.gateway.base_url_for(env.rollout_id, env.attempt_id), api_key="tok", max_retries=0
            )
            reply = await client.chat.completions.create(model="m", messages=MESSAGES)
            assert reply.choices[0].message.content == "The answer is 42."
            await gw.flush()
            (span,) = await env.spans()
            assert span.attributes[semconv.POLICY_VERSION] == 5
    finally:
        await close(env)


async def test_gateway_client_names_what_to_do_when_unreachable() -> None:
    with pytest.raises(GatewayControlError, match="agentbolt gateway serve"):
        async with GatewayClient("http://127.0.0.1:9", timeout=2) as gw:
            await gw.pause()
    with pytest.raises(UserError, match="http://"):
        GatewayClient("127.0.0.1:4800")
