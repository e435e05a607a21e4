"""vLLM as the generator (agentbolt_torch.serving.vllm), with a real vLLM server: the generator
protocol's conformance, and exact ids, logprobs and versions through the gateway for Chat
Completions, Responses and Messages calls.

One vLLM server serves the whole module (a cold start takes minutes on a CPU): each test starts
from the same weights at version 0, which the ``policy`` fixture restores and syncs to vLLM.
Logprobs are checked against a plain fp32 forward pass of the policy's weights at 1e-3 (vLLM in
float32 matches to about 1e-5). Marked ``vllm``: run with ``./dev vllm``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

torch = pytest.importorskip("torch")

from vllm_support import vllm_python_or_skip, vllm_tiny  # noqa: E402

from agentbolt import semconv  # noqa: E402
from agentbolt import types as t  # noqa: E402
from agentbolt.gateway import Gateway  # noqa: E402
from agentbolt.store import open_store  # noqa: E402
from agentbolt_torch.generation.generator import Generator  # noqa: E402
from agentbolt_torch.policy import Policy  # noqa: E402
from agentbolt_torch.serving.vllm import VLLMGenerator  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]  # a cold vLLM start: minutes on a loaded CPU
PYTHON = vllm_python_or_skip()

from test_generator_protocol import GeneratorConformance  # noqa: E402


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Policy, VLLMGenerator, dict[str, Any]]]:
    model, tokenizer = vllm_tiny(seed=0)
    policy = Policy(model, tokenizer, name="tiny", autocast_dtype=None)
    initial = {k: v.detach().clone() for k, v in policy.model.state_dict().items()}
    work = tmp_path_factory.mktemp("vllm")
    generator = VLLMGenerator(policy, python=PYTHON, work_dir=work, dtype="float32", kv_cache_gb=1, max_model_len=512)
    generator.start()
    url, log = generator.base_url, Path(generator.process.log_path)
    yield policy, generator, initial
    generator.stop()
    # stop ends serving: the front refuses connections, the server process is gone, its log kept
    import httpx

    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}/models", timeout=5)
    assert not generator.process.running()
    assert log.is_file()


@pytest.fixture
def vllm_shared(shared: tuple[Policy, VLLMGenerator, dict[str, Any]]) -> tuple[Policy, VLLMGenerator]:
    """The shared policy back at its first weights and version 0, and vLLM serving them."""
    policy, generator, initial = shared
    generator.pause(drain=True, timeout=60)
    with policy.lock, torch.no_grad():
        policy.model.load_state_dict(initial)
        policy.mark_weights_changed()
    policy.set_version(0)
    generator.resume()
    return policy, generator


class TestVLLMGenerator(GeneratorConformance):
    @pytest.fixture
    def policy(self, vllm_shared: tuple[Policy, VLLMGenerator]) -> Policy:
        return vllm_shared[0]

    @pytest.fixture
    def generator(self, vllm_shared: tuple[Policy, VLLMGenerator]) -> Generator:
        generator = vllm_shared[1]
        assert isinstance(generator, Generator)
        return generator

    def test_stop_ends_serving(self, policy: Policy) -> None:
        pytest.skip("checked when the module's shared vLLM server stops (the `shared` fixture's teardown)")


def test_an_update_writes_and_loads_the_weights_once_and_the_prefix_cache_is_not_stale(
    vllm_shared: tuple[Policy, VLLMGenerator], check_logprobs: Any
) -> None:
    """The same prompt before and after a sync: vLLM's prefix cache holds the prompt's old keys
    and values unless the sync resets it; the answer after the sync matches the new weights."""
    import httpx

    policy, generator = vllm_shared
    body = {"model": "tiny", "prompt": [1, 5, 9, 13, 17, 21, 25], "max_tokens": 4, "temperature": 0.0,
            "logprobs": 0, "return_token_ids": True}  # fmt: skip
    first = httpx.post(f"{generator.base_url}/completions", json=body, timeout=60).json()["choices"][0]
    syncs = len(generator.sync_seconds)
    generator.pause(drain=True, timeout=60)
    generator.resume()  # nothing changed: nothing written or loaded
    assert len(generator.sync_seconds) == syncs
    generator.pause(drain=True, timeout=60)
    with policy.lock, torch.no_grad():
        for p in policy.model.parameters():
            p.mul_(1.1)
        policy.mark_weights_changed()
    policy.bump_version()
    generator.resume()
    assert len(generator.sync_seconds) == syncs + 1
    answer = httpx.post(f"{generator.base_url}/completions", json=body, timeout=60)
    again = answer.json()["choices"][0]
    assert answer.headers["x-agentbolt-policy-version"] == "1"
    assert again["logprobs"]["token_logprobs"] != first["logprobs"]["token_logprobs"]
    check_logprobs(policy.model, body["prompt"], again["token_ids"], again["logprobs"]["token_logprobs"])


# -- through the gateway -----------------------------------------------------------------------


@pytest_asyncio.fixture
async def gateway(vllm_shared: tuple[Policy, VLLMGenerator]) -> AsyncIterator[tuple[Gateway, str, Any]]:
    generator = vllm_shared[1]
    store = open_store("memory://")
    await store.enqueue([t.RolloutSpec(rollout_id="r1")])
    (claim,) = await store.dequeue("w", lease_s=3600)  # a loaded CPU can take minutes: no lease expiry
    gw = Gateway(store, [generator.base_url], served_model="tiny", sampling={"temperature": 1.0, "max_tokens": 8})
    await gw.start()
    try:
        yield gw, gw.base_url_for("r1", claim.attempt.attempt_id), store
    finally:
        await gw.stop()
        await store.close()


async def _llm_spans(gw: Gateway, store: Any) -> list[t.Span]:
    await gw.flush()
    spans = (await store.query_spans(["r1"]))["r1"]
    return [s for s in spans if s.attributes.get(semconv.SPAN_KIND_ATTR) == semconv.KIND_LLM]


def _assert_exact(span: t.Span, policy: Policy, messages: list[dict[str, str]], check_logprobs: Any) -> None:
    a = span.attributes
    assert a[semconv.TOKEN_SOURCE] == semconv.TOKEN_SOURCE_EXACT
    expected = policy.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    expected = list(expected["input_ids"] if hasattr(expected, "keys") else expected)
    assert a[semconv.PROMPT_TOKEN_IDS] == expected  # vLLM renders with the policy's own template
    response = a[semconv.RESPONSE_TOKEN_IDS]
    check_logprobs(policy.model, expected, response, a[semconv.RESPONSE_LOGPROBS])
    assert a[semconv.POLICY_VERSION] == policy.version


@pytest.mark.parametrize("stream", [False, True])
async def test_chat_completions_through_the_gateway_are_exact(
    vllm_shared: tuple[Policy, VLLMGenerator], gateway: tuple[Gateway, str, Any], check_logprobs: Any, stream: bool
) -> None:
    import openai

    policy, _ = vllm_shared
    gw, base, store = gateway
    client = openai.AsyncOpenAI(base_url=base, api_key="k", max_retries=0)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 6 times 7?"}]
    if stream:
        async for _ in await client.chat.completions.create(model="m", messages=messages, stream=True):  # type: ignore[arg-type]
            pass
    else:
        await client.chat.completions.create(model="m", messages=messages)  # type: ignore[arg-type]
    (span,) = await _llm_spans(gw, store)
    _assert_exact(span, policy, messages, check_logprobs)


async def test_responses_through_the_gateway_are_exact(
    vllm_shared: tuple[Policy, VLLMGenerator], gateway: tuple[Gateway, str, Any], check_logprobs: Any
) -> None:
    import openai

    policy, _ = vllm_shared
    gw, base, store = gateway
    client = openai.AsyncOpenAI(base_url=base, api_key="k", max_retries=0)
    await client.responses.create(model="m", instructions="Be brief.", input="What is 6 times 7?")
    (span,) = await _llm_spans(gw, store)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 6 times 7?"}]
    _assert_exact(span, policy, messages, check_logprobs)
    assert span.attributes[semconv.LLM_API] == "responses"


async def test_messages_through_the_gateway_are_exact(
    vllm_shared: tuple[Policy, VLLMGenerator], gateway: tuple[Gateway, str, Any], check_logprobs: Any
) -> None:
    import anthropic

    policy, _ = vllm_shared
    gw, base, store = gateway
    client = anthropic.AsyncAnthropic(base_url=base.removesuffix("/v1"), api_key="k", max_retries=0)
    await client.messages.create(
        model="m", max_tokens=8, system="Be brief.", messages=[{"role": "user", "content": "What is 6 times 7?"}]
    )
    (span,) = await _llm_spans(gw, store)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 6 times 7?"}]
    _assert_exact(span, policy, messages, check_logprobs)
    assert span.attributes[semconv.LLM_API] == "messages"


async def test_an_update_changes_what_the_gateway_records(
    vllm_shared: tuple[Policy, VLLMGenerator], gateway: tuple[Gateway, str, Any], check_logprobs: Any
) -> None:
    """Calls before and after pause → update → resume: each span names the version that
    generated it, and its logprobs are that version's."""
    import asyncio

    import openai

    policy, generator = vllm_shared
    gw, base, store = gateway
    client = openai.AsyncOpenAI(base_url=base, api_key="k", max_retries=0)
    messages = [{"role": "user", "content": "What is 6 times 7?"}]
    await client.chat.completions.create(model="m", messages=messages)  # type: ignore[arg-type]
    old = {k: v.detach().clone() for k, v in policy.model.state_dict().items()}
    await asyncio.to_thread(generator.pause, drain=True, timeout=60)
    with policy.lock, torch.no_grad():
        for p in policy.model.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(3)) * 0.05)
        policy.mark_weights_changed()
    policy.bump_version()
    await asyncio.to_thread(generator.resume)
    await client.chat.completions.create(model="m", messages=messages)  # type: ignore[arg-type]
    before, after = await _llm_spans(gw, store)
    assert (before.attributes[semconv.POLICY_VERSION], after.attributes[semconv.POLICY_VERSION]) == (0, 1)
    _assert_exact(after, policy, messages, check_logprobs)
    model, _ = vllm_tiny(seed=0)
    model.load_state_dict(old)
    a = before.attributes
    check_logprobs(model, a[semconv.PROMPT_TOKEN_IDS], a[semconv.RESPONSE_TOKEN_IDS], a[semconv.RESPONSE_LOGPROBS])
