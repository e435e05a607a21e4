"""The policy server: exact token ids and logprobs (vs a forward pass), streaming, batching, pause."""

from __future__ import annotations

import concurrent.futures
import json
import threading
import time
from typing import Any

import httpx
import pytest
import torch

from agentbolt_torch.chat import render_chat
from agentbolt_torch.generation.engine import GenerationEngine, SamplingParams, sample_tokens
from agentbolt_torch.policy import Policy
from agentbolt_torch.serving.server import POLICY_VERSION_HEADER, PolicyServer

openai = pytest.importorskip("openai")

MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is 3 + 5?"},
]


def chat_prompt_ids(tokenizer: Any, messages: list[dict[str, Any]], tools: Any = None) -> list[int]:
    return tokenizer(render_chat(tokenizer, messages, tools), add_special_tokens=False)["input_ids"]


def test_chat_token_ids_and_logprobs_match_forward(client: Any, fp32_policy: Policy, check_logprobs: Any) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="tiny",
        messages=MESSAGES,
        max_tokens=12,
        logprobs=True,
        top_logprobs=3,
        seed=7,
        extra_body={"return_token_ids": True},
    )
    assert raw.headers[POLICY_VERSION_HEADER] == str(fp32_policy.version)
    r = raw.parse()
    tok = fp32_policy.tokenizer
    assert r.prompt_token_ids == chat_prompt_ids(tok, MESSAGES)
    choice = r.choices[0]
    ids = choice.token_ids
    entries = choice.logprobs.content
    assert len(entries) == len(ids) > 0
    check_logprobs(fp32_policy.model, r.prompt_token_ids, ids, [e.logprob for e in entries])
    # top_logprobs are the forward pass's most likely tokens, best first
    ref = torch.log_softmax(
        fp32_policy.model(input_ids=torch.tensor([r.prompt_token_ids + ids])).logits[0, len(r.prompt_token_ids) - 1],
        -1,
    )
    top = ref.topk(3)
    assert [t.logprob for t in entries[0].top_logprobs] == pytest.approx(top.values.tolist(), abs=1e-3)
    assert entries[0].top_logprobs[0].token == tok.decode([int(top.indices[0])])
    assert choice.message.content == tok.decode(ids, skip_special_tokens=True)
    assert r.usage.prompt_tokens == len(r.prompt_token_ids)
    assert r.usage.completion_tokens == len(ids)
    assert choice.finish_reason in ("stop", "length")
    if choice.finish_reason == "length":
        assert len(ids) == 12


def test_completions_token_ids_and_logprobs(client: Any, fp32_policy: Policy, check_logprobs: Any) -> None:
    tok = fp32_policy.tokenizer
    r = client.completions.create(
        model="tiny",
        prompt="The capital of France is",
        max_tokens=10,
        logprobs=2,
        seed=3,
        extra_body={"return_token_ids": True},
    )
    choice = r.choices[0]
    prompt_ids = choice.prompt_token_ids
    assert prompt_ids == tok("The capital of France is")["input_ids"]
    lp = choice.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.text_offset) == len(choice.token_ids)
    check_logprobs(fp32_policy.model, prompt_ids, choice.token_ids, lp.token_logprobs)
    assert lp.text_offset[0] == 0
    for entry, token in zip(lp.top_logprobs, lp.tokens, strict=True):
        assert token in entry
    # token id prompts are accepted as is
    r2 = client.completions.create(
        model="tiny", prompt=prompt_ids, max_tokens=4, seed=3, extra_body={"return_token_ids": True}
    )
    assert r2.choices[0].prompt_token_ids == prompt_ids
    assert r2.choices[0].token_ids == choice.token_ids[:4]


def test_chat_streaming_matches_non_streaming(client: Any, fp32_policy: Policy, check_logprobs: Any) -> None:
    kwargs = {"model": "tiny", "messages": MESSAGES, "max_tokens": 10, "seed": 11, "logprobs": True}
    full = client.chat.completions.create(**kwargs, extra_body={"return_token_ids": True})
    stream = client.chat.completions.create(
        **kwargs, stream=True, stream_options={"include_usage": True}, extra_body={"return_token_ids": True}
    )
    chunks = list(stream)
    first = chunks[0].model_dump()
    assert first["prompt_token_ids"] == full.prompt_token_ids
    ids: list[int] = []
    logprobs: list[float] = []
    text = ""
    finish = None
    usage = None
    for chunk in chunks:
        data = chunk.model_dump()
        if data.get("usage"):
            usage = data["usage"]
        for c in data["choices"]:
            ids += c.get("token_ids") or []
            if c.get("logprobs"):
                logprobs += [e["logprob"] for e in c["logprobs"]["content"]]
            text += c["delta"].get("content") or ""
            finish = c.get("finish_reason") or finish
    assert ids == full.choices[0].token_ids
    assert len(logprobs) == len(ids)
    check_logprobs(fp32_policy.model, full.prompt_token_ids, ids, logprobs)
    assert text == full.choices[0].message.content
    assert finish == full.choices[0].finish_reason
    assert usage["completion_tokens"] == len(ids)


def test_completions_streaming(client: Any, fp32_policy: Policy, check_logprobs: Any) -> None:
    stream = client.completions.create(
        model="tiny", prompt="Hello", max_tokens=8, logprobs=1, stream=True, extra_body={"return_token_ids": True}
    )
    prompt_ids = None
    ids: list[int] = []
    logprobs: list[float] = []
    for chunk in stream:
        c = chunk.choices[0].model_dump()
        if c.get("prompt_token_ids") is not None:
            assert prompt_ids is None, "prompt_token_ids only in the first chunk"
            prompt_ids = c["prompt_token_ids"]
        ids += c.get("token_ids") or []
        if c.get("logprobs"):
            logprobs += c["logprobs"]["token_logprobs"]
    assert prompt_ids == fp32_policy.tokenizer("Hello")["input_ids"]
    check_logprobs(fp32_policy.model, prompt_ids, ids, logprobs)


def test_n_samples_each_match(client: Any, fp32_policy: Policy, check_logprobs: Any) -> None:
    r = client.chat.completions.create(
        model="tiny", messages=MESSAGES, n=4, max_tokens=8, logprobs=True, extra_body={"return_token_ids": True}
    )
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert len({tuple(c.token_ids) for c in r.choices}) > 1, "the samples should differ"
    for c in r.choices:
        check_logprobs(fp32_policy.model, r.prompt_token_ids, c.token_ids, [e.logprob for e in c.logprobs.content])


def test_concurrent_requests_are_batched_and_exact(
    server: PolicyServer, engine: GenerationEngine, fp32_policy: Policy, check_logprobs: Any
) -> None:
    before = engine.stats
    engine.reset_stats()
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=60)

    def one(i: int) -> Any:
        messages = [{"role": "user", "content": f"Question {i}: what is {i} + {i}?" + " Think." * i}]
        return client.chat.completions.create(
            model="tiny",
            messages=messages,
            max_tokens=4 + 3 * i,
            temperature=[1.0, 0.7, 0.0, 1.3][i % 4],
            top_p=[1.0, 0.9, 1.0, 0.8][i % 4],
            logprobs=True,
            extra_body={"return_token_ids": True},
        )

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        results = list(pool.map(one, range(6)))
    stats = engine.stats
    assert stats.requests == 6
    assert stats.max_batch_requests >= 2, f"requests were not batched: {stats}"
    assert stats.prefill_batches < 6 or stats.max_batch_rows >= 2
    for i, r in enumerate(results):
        c = r.choices[0]
        assert len(c.token_ids) <= 4 + 3 * i
        check_logprobs(fp32_policy.model, r.prompt_token_ids, c.token_ids, [e.logprob for e in c.logprobs.content])
    assert before.requests >= 0


def test_greedy_and_seed_are_reproducible(engine: GenerationEngine, fp32_policy: Policy) -> None:
    tok = fp32_policy.tokenizer
    prompt = tok("What is 20 - 4?")["input_ids"]
    greedy = engine.generate(prompt, SamplingParams(max_tokens=8, temperature=0.0))[0]
    ids = torch.tensor([prompt + greedy.token_ids])
    logits = fp32_policy.model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
    assert logits.argmax(-1).tolist() == greedy.token_ids
    seeded = SamplingParams(max_tokens=8, seed=1234)
    a = engine.generate(prompt, seeded)[0]
    # the same seed gives the same tokens even when other requests share the batch
    handles = [engine.submit(tok(f"noise {i}")["input_ids"], SamplingParams(max_tokens=6)) for i in range(3)]
    b = engine.submit(prompt, seeded)
    for h in handles:
        h.wait(60)
    assert b.wait(60)[0].token_ids == a.token_ids


def test_stop_strings_and_max_tokens(engine: GenerationEngine, fp32_policy: Policy) -> None:
    tok = fp32_policy.tokenizer
    prompt = tok("The quick brown fox")["input_ids"]
    base = engine.generate(prompt, SamplingParams(max_tokens=16, seed=5, ignore_eos=True))[0]
    assert base.finish_reason == "length" and len(base.token_ids) == 16
    text = base.text
    assert len(text) > 6
    stop = text[4:6]
    cut = engine.generate(prompt, SamplingParams(max_tokens=16, seed=5, ignore_eos=True, stop=(stop,)))[0]
    assert cut.finish_reason == "stop" and cut.stop_reason == stop
    assert cut.text == text[: text.find(stop)]
    assert cut.token_ids == base.token_ids[: len(cut.token_ids)]
    assert len(cut.logprobs) == len(cut.token_ids)
    kept = engine.generate(
        prompt, SamplingParams(max_tokens=16, seed=5, ignore_eos=True, stop=(stop,), include_stop_str_in_output=True)
    )[0]
    assert kept.text == text[: text.find(stop) + len(stop)]


def test_stream_holds_back_stop_string_prefix(client: Any) -> None:
    full = client.completions.create(
        model="tiny", prompt="Hello", max_tokens=12, seed=9, extra_body={"ignore_eos": True}
    )
    text = full.choices[0].text
    stop = text[3:7]
    pieces = [
        c.choices[0].text
        for c in client.completions.create(
            model="tiny",
            prompt="Hello",
            max_tokens=12,
            seed=9,
            stop=[stop],
            stream=True,
            extra_body={"ignore_eos": True},
        )
    ]
    assert "".join(pieces) == text[: text.find(stop)]


def test_models_health_and_policy_version(server: PolicyServer, fp32_policy: Policy, client: Any) -> None:
    models = httpx.get(f"{server.base_url}/models").json()
    card = models["data"][0]
    assert card["id"] == "tiny" and card["max_model_len"] == fp32_policy.max_model_len
    version = fp32_policy.version
    try:
        fp32_policy.set_version(version + 5)
        raw = client.chat.completions.with_raw_response.create(model="x", messages=MESSAGES, max_tokens=2)
        assert raw.headers[POLICY_VERSION_HEADER] == str(version + 5)
        assert json.loads(raw.text)["policy_version"] == version + 5
        assert httpx.get(f"{server.base_url}/models").json()["data"][0]["policy_version"] == version + 5
        health = httpx.get(f"{server.url}/health").json()
        assert health["status"] == "ok" and health["policy_version"] == version + 5
    finally:
        fp32_policy.set_version(version)


def test_bad_requests_are_400(client: Any) -> None:
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=[], max_tokens=2)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=MESSAGES, top_p=1.5)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="tiny", prompt=[10**9], max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="context length"):
        client.completions.create(model="tiny", prompt=[5] * 5000, max_tokens=2)


def test_pause_drains_and_holds_new_requests(engine: GenerationEngine, fp32_policy: Policy) -> None:
    tok = fp32_policy.tokenizer
    prompt = tok("pause test")["input_ids"]
    inflight = engine.submit(prompt, SamplingParams(max_tokens=20, ignore_eos=True))
    deadline = time.monotonic() + 30
    while inflight.policy_version is None and time.monotonic() < deadline:  # wait until it generates
        time.sleep(0.005)
    engine.pause(drain=True, timeout=60)
    try:
        assert inflight.done, "pause(drain=True) returns after in-flight requests finished"
        waiting = engine.submit(prompt, SamplingParams(max_tokens=3))
        time.sleep(0.2)
        assert not waiting.done and engine.num_queued == 1
        with fp32_policy.lock:  # what an update does: nothing generates meanwhile
            version = fp32_policy.bump_version()
    finally:
        engine.resume()
    out = waiting.wait(60)
    assert out[0].policy_version == version
    fp32_policy.set_version(version - 1)


def test_streaming_disconnect_cancels_generation(server: PolicyServer, engine: GenerationEngine) -> None:
    body = {
        "model": "tiny",
        "prompt": "Hello",
        "max_tokens": 400,
        "stream": True,
        "ignore_eos": True,
    }
    with httpx.stream("POST", f"{server.base_url}/completions", json=body, timeout=60) as response:
        for i, _ in enumerate(response.iter_lines()):
            if i > 4:
                break
    deadline = time.monotonic() + 20
    while engine.num_active and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.num_active == 0


def test_lock_blocks_generation_during_update(engine: GenerationEngine, fp32_policy: Policy) -> None:
    """Holding Policy.lock (what PolicyUpdater does) stops forward passes without pausing."""
    tok = fp32_policy.tokenizer
    started = threading.Event()
    with fp32_policy.lock:
        handle = engine.submit(tok("locked")["input_ids"], SamplingParams(max_tokens=3))
        started.set()
        time.sleep(0.3)
        assert not handle.done
    assert len(handle.wait(60)[0].token_ids) <= 3


def test_bf16_autocast_logprobs_close_to_forward(tiny: tuple[Any, Any]) -> None:
    """With bf16 autocast the reported logprobs match a bf16-autocast forward pass of the same tokens."""
    model, tokenizer = tiny
    policy = Policy(model, tokenizer, name="tiny", autocast_dtype="bfloat16")
    with GenerationEngine(policy, batch_window_s=0) as eng:
        prompt = tokenizer("autocast check")["input_ids"]
        out = eng.generate(prompt, SamplingParams(max_tokens=10, seed=2), timeout=60)[0]
    ids = torch.tensor([prompt + out.token_ids])
    with torch.no_grad(), policy.autocast():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(out.token_ids)[:, None]).squeeze(1)
    assert (expected - torch.tensor(out.logprobs)).abs().max().item() < 0.05


def test_cached_weight_casts_equal_plain_autocast(tiny: tuple[Any, Any]) -> None:
    """Casting the linear weights once per version gives exactly what autocast gives per step."""
    model, tokenizer = tiny
    policy = Policy(model, tokenizer, name="tiny", autocast_dtype="bfloat16")
    prompt = tokenizer("cast cache")["input_ids"]
    outputs = []
    for cast in (True, False):
        with GenerationEngine(policy, batch_window_s=0, cast_weights=cast) as eng:
            outputs.append(eng.generate(prompt, SamplingParams(max_tokens=8, seed=4), timeout=60)[0])
    assert outputs[0].token_ids == outputs[1].token_ids
    assert outputs[0].logprobs == outputs[1].logprobs


def test_kv_cache_in_the_autocast_dtype_gives_the_same_samples_and_logprobs(
    tiny: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keys stored in bf16 (the dtype attention reads them in under autocast) instead of the
    float32 the rotary embedding produces: the same tokens and logprobs bit for bit, and the
    prompt cache's keys take half the bytes."""
    from transformers import DynamicCache

    from agentbolt_torch._kv_caches import AutocastDtypeCache

    model, tokenizer = tiny
    policy = Policy(model, tokenizer, name="tiny", autocast_dtype="bfloat16")
    prompts = [tokenizer(text)["input_ids"] for text in ("kv dtype", "a longer prompt for the kv dtype check", "x")]

    def run() -> tuple[list[Any], set[torch.dtype]]:
        with GenerationEngine(policy, batch_window_s=0) as eng:
            eng.pause(drain=True, timeout=60)  # admitted together: one prefill, one running batch
            handles = [eng.submit(p, SamplingParams(max_tokens=8, seed=i), n=2) for i, p in enumerate(prompts)]
            eng.resume()
            outputs = [c for h in handles for c in h.wait(60)]
            key_dtypes = {k.dtype for entry in eng._prompts.values() for k in entry.keys}
        return [(c.token_ids, c.logprobs) for c in outputs], key_dtypes

    stored_bf16, dtypes = run()
    assert dtypes == {torch.bfloat16}
    monkeypatch.setattr(AutocastDtypeCache, "update", DynamicCache.update)
    stored_as_produced, dtypes = run()
    assert dtypes == {torch.float32}
    assert stored_bf16 == stored_as_produced


def test_auto_autocast_follows_the_hardware(tiny: tuple[Any, Any]) -> None:
    from agentbolt_torch.policy import default_autocast_dtype

    model, tokenizer = tiny
    assert Policy(model, tokenizer).autocast_dtype == default_autocast_dtype("cpu")
    fast = torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported()
    assert default_autocast_dtype("cpu") == (torch.bfloat16 if fast else None)


def test_processed_logprobs_mode(fp32_policy: Policy) -> None:
    """logprobs_mode="processed" reports the logprob under the temperature-scaled distribution."""
    tok = fp32_policy.tokenizer
    prompt = tok("processed mode")["input_ids"]
    with GenerationEngine(fp32_policy, batch_window_s=0, logprobs_mode="processed") as eng:
        out = eng.generate(prompt, SamplingParams(max_tokens=6, temperature=0.5, seed=1), timeout=60)[0]
        greedy = eng.generate(prompt, SamplingParams(max_tokens=3, temperature=0), timeout=60)[0]
    with torch.no_grad():
        logits = fp32_policy.model(input_ids=torch.tensor([prompt + out.token_ids])).logits[0, len(prompt) - 1 : -1]
    expected = torch.log_softmax(logits / 0.5, -1).gather(1, torch.tensor(out.token_ids)[:, None]).squeeze(1)
    assert out.logprobs == pytest.approx(expected.tolist(), abs=1e-3)
    assert greedy.logprobs == [0.0, 0.0, 0.0]


def test_sampler_follows_the_distribution() -> None:
    """Frequencies match softmax(logits / T); top-p / top-k never pick truncated tokens."""
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]]).repeat(40_000, 1)
    generator = torch.Generator().manual_seed(0)

    def freqs(params: SamplingParams) -> torch.Tensor:
        tokens, logprobs, _ = sample_tokens(logits, [params] * len(logits), [None] * len(logits), generator)
        raw = torch.log_softmax(logits[0], -1)
        assert torch.allclose(logprobs, raw[tokens])  # raw-policy logprobs whatever the sampling settings
        return torch.bincount(tokens, minlength=5).float() / len(tokens)

    for temperature in (1.0, 0.5):
        expected = torch.softmax(logits[0] / temperature, -1)
        assert (freqs(SamplingParams(temperature=temperature)) - expected).abs().max() < 0.01
    top_p = freqs(SamplingParams(top_p=0.6))  # p = .563, .207, ...: the first two tokens reach 0.6
    p = torch.softmax(logits[0], -1)
    assert top_p[2:].sum() == 0 and top_p[0].item() == pytest.approx((p[0] / p[:2].sum()).item(), abs=0.01)
    top_k = freqs(SamplingParams(top_k=3))
    assert top_k[3:].sum() == 0 and top_k[:3].min() > 0
    assert freqs(SamplingParams(temperature=0))[0] == 1.0
