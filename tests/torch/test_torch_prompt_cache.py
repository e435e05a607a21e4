"""The engine's prompt cache: identical prompts run through the model once, with exact results."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch

from agentbolt.errors import UserError
from agentbolt_torch.generation.engine import GenerationEngine, SamplingParams
from agentbolt_torch.policy import Policy


def prompt(policy: Policy, text: str) -> list[int]:
    return policy.tokenizer(text)["input_ids"]


def test_identical_prompts_admitted_together_run_once(fp32_policy: Policy, check_logprobs: Any) -> None:
    """A GRPO group sent as separate requests: one prompt pass, every sample exact (whether the
    group lands in one prefill or several, the later ones hit the cache)."""
    a, b = prompt(fp32_policy, "What is 12 + 30? Answer briefly."), prompt(fp32_policy, "Name a colour.")
    running = prompt(fp32_policy, "A long running request that is already generating when the group arrives")
    with GenerationEngine(fp32_policy, batch_window_s=0.5, max_batch_size=16, seed=3) as engine:
        first = engine.submit(running, SamplingParams(max_tokens=20, ignore_eos=True))
        deadline = time.monotonic() + 30
        while engine.num_active == 0 and time.monotonic() < deadline:  # the group joins a running batch
            time.sleep(0.005)
        engine.reset_stats()
        handles = [engine.submit(a, SamplingParams(max_tokens=8)) for _ in range(4)]
        handles += [engine.submit(b, SamplingParams(max_tokens=8)) for _ in range(2)]
        handles.append(engine.submit(a, SamplingParams(max_tokens=8), n=2))
        outputs = [c for h in handles for c in h.wait(60)]
        first.wait(60)
        stats = engine.stats
    assert stats.requests == 7 and stats.sequences == 8
    assert stats.prompt_tokens == len(a) + len(b)
    assert stats.prompt_cache_hits == 5 and stats.cached_prompt_tokens == 4 * len(a) + len(b)
    for handle in handles:
        for completion in handle.outputs:
            assert completion is not None
            check_logprobs(fp32_policy.model, handle.prompt_ids, completion.token_ids, completion.logprobs)
    assert len({tuple(c.token_ids) for c in outputs}) > 1  # samples differ: rows are not copies


def test_cached_prompt_gives_the_same_samples_as_a_fresh_prefill(fp32_policy: Policy) -> None:
    text = prompt(fp32_policy, "Count to five:")
    seeded = SamplingParams(max_tokens=10, seed=77)
    with GenerationEngine(fp32_policy, batch_window_s=0, prompt_cache_mb=0) as plain:
        expected = plain.generate(text, seeded, timeout=60)[0]
        plain.generate(text, seeded, timeout=60)
        assert plain.stats.prompt_tokens == 2 * len(text) and plain.stats.prompt_cache_hits == 0
    with GenerationEngine(fp32_policy, batch_window_s=0) as engine:
        engine.generate(text, seeded, timeout=60)
        cached = engine.generate(text, seeded, timeout=60)[0]
        assert engine.stats.prompt_tokens == len(text) and engine.stats.prompt_cache_hits == 1
        # new weights (or a new version) empty the cache: the prompt runs again
        fp32_policy.mark_weights_changed()
        engine.generate(text, seeded, timeout=60)
        assert engine.stats.prompt_tokens == 2 * len(text)
    assert cached.token_ids == expected.token_ids
    assert cached.logprobs == pytest.approx(expected.logprobs, abs=1e-5)


def test_prompt_cache_is_bounded_lru(fp32_policy: Policy) -> None:
    a, b = prompt(fp32_policy, "first prompt here"), prompt(fp32_policy, "second prompt here")
    params = SamplingParams(max_tokens=2)
    with GenerationEngine(fp32_policy, batch_window_s=0) as engine:
        engine.generate(a, params, timeout=60)
        one_entry = engine._prompts_bytes
        assert one_entry > 0
        engine.prompt_cache_bytes = int(one_entry * 1.5)  # room for one prompt of this size
        for text in (b, a, a):
            engine.generate(text, params, timeout=60)
        assert engine._prompts_bytes <= engine.prompt_cache_bytes
        # a cached; b evicted it; a computed again (evicting b), then cached
        assert engine.stats.prompt_tokens == 2 * len(a) + len(b)
        assert engine.stats.prompt_cache_hits == 1
    with pytest.raises(UserError, match="prompt_cache_mb"):
        GenerationEngine(fp32_policy, prompt_cache_mb=-1)


def test_prompt_cache_with_bf16_autocast(tiny: tuple[Any, Any]) -> None:
    model, tokenizer = tiny
    policy = Policy(model, tokenizer, name="tiny", autocast_dtype="bfloat16")
    text = prompt(policy, "bf16 prompt")
    with GenerationEngine(policy, batch_window_s=0) as engine:
        a = engine.generate(text, SamplingParams(max_tokens=6, temperature=0), timeout=60)[0]
        b = engine.generate(text, SamplingParams(max_tokens=6, temperature=0), timeout=60)[0]
        assert engine.stats.prompt_cache_hits == 1
    assert a.token_ids == b.token_ids
    assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs))
