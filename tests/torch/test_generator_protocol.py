"""The generator protocol (agentbolt_torch.generation.generator), checked on agentbolt's own
generator (engine + policy server, ``LocalGenerator``) over HTTP as the gateway reaches it.

``GeneratorConformance`` is written against the protocol only: another generator (e.g. one
wrapping vLLM) subclasses it with its own ``make_generator``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from typing import Any

import httpx
import pytest

torch = pytest.importorskip("torch")

from agentbolt_torch.generation.generator import Generator  # noqa: E402
from agentbolt_torch.models import tiny_model  # noqa: E402
from agentbolt_torch.policy import Policy  # noqa: E402
from agentbolt_torch.serving.local import LocalGenerator  # noqa: E402

PROMPT = [1, 5, 9, 13, 17, 21]


def _complete(generator: Generator, prompt: list[int], *, seed: int = 7) -> tuple[list[int], list[float], int]:
    """A greedy completion of ``prompt`` through the generator's endpoint: its token ids, their
    logprobs and the policy version the response names."""
    r = httpx.post(
        f"{generator.base_url}/completions",
        json={
            "model": generator.served_model_name,
            "prompt": prompt,
            "max_tokens": 6,
            "temperature": 0.0,
            "logprobs": 0,
            "seed": seed,
            "return_token_ids": True,
        },
        timeout=60,
    )
    r.raise_for_status()
    choice = r.json()["choices"][0]
    assert choice["prompt_token_ids"] == prompt
    return choice["token_ids"], choice["logprobs"]["token_logprobs"], int(r.headers["x-agentbolt-policy-version"])


def _perturb(policy: Policy) -> None:
    """Change the weights as an update would (in place, then a new version)."""
    with policy.lock, torch.no_grad():
        for p in policy.model.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 0.05)
        policy.mark_weights_changed()
    policy.bump_version()


class GeneratorConformance:
    """What every :class:`~agentbolt_torch.generation.generator.Generator` must do."""

    def make_generator(self, policy: Policy) -> Generator:
        raise NotImplementedError

    @pytest.fixture
    def policy(self) -> Policy:
        model, tokenizer = tiny_model(seed=0)  # its own model: the tests change its weights
        return Policy(model, tokenizer, name="tiny", autocast_dtype=None)

    @pytest.fixture
    def generator(self, policy: Policy) -> Iterator[Generator]:
        generator = self.make_generator(policy)
        assert isinstance(generator, Generator)
        assert generator.start() == generator.base_url
        try:
            yield generator
        finally:
            generator.stop()

    def test_serves_exact_ids_logprobs_and_the_version(
        self, generator: Generator, policy: Policy, check_logprobs: Any
    ) -> None:
        models = httpx.get(f"{generator.base_url}/models", timeout=30).json()
        assert generator.served_model_name in [m["id"] for m in models["data"]]
        before = generator.stats
        ids, logprobs, version = _complete(generator, PROMPT)
        assert version == policy.version == 0
        check_logprobs(policy.model, PROMPT, ids, logprobs)
        assert generator.stats.generated_tokens - before.generated_tokens == len(ids)
        assert generator.state()["paused"] is False

    def test_pause_update_resume_serves_the_new_weights(
        self, generator: Generator, policy: Policy, check_logprobs: Any
    ) -> None:
        old = _complete(generator, PROMPT)
        generator.pause(drain=True, timeout=30)
        _perturb(policy)
        generator.resume()
        ids, logprobs, version = _complete(generator, PROMPT)
        assert version == 1
        check_logprobs(policy.model, PROMPT, ids, logprobs)  # the updated weights' logprobs
        assert logprobs != old[1]

    def test_a_call_during_a_pause_waits_and_none_fails(
        self, generator: Generator, policy: Policy, check_logprobs: Any
    ) -> None:
        """A call that arrives while paused waits (it is queued, not refused) and is answered after
        :meth:`resume` by the weights the update left: version 1, their logprobs."""
        generator.pause(drain=True, timeout=30)
        with ThreadPoolExecutor(max_workers=1) as pool:
            call = pool.submit(_complete, generator, PROMPT)
            deadline = time.monotonic() + 60
            while generator.state()["queued"] < 1:  # the call reached the generator and waits
                assert not call.done(), "a call made during a pause was answered (or failed) before resume"
                assert time.monotonic() < deadline, "the call never reached the generator"
                time.sleep(0.01)
            with pytest.raises(FuturesTimeout):  # still waiting: paused, a call is held, not answered
                call.result(timeout=1.0)
            _perturb(policy)
            generator.resume()
            ids, logprobs, version = call.result(timeout=60)
        assert version == 1
        check_logprobs(policy.model, PROMPT, ids, logprobs)

    def test_the_serving_copy_serves_the_old_weights_until_the_swap(
        self, generator: Generator, policy: Policy, check_logprobs: Any
    ) -> None:
        generator.serve_copy()
        old_ids, old_logprobs, _ = _complete(generator, PROMPT)
        _perturb(policy)  # the updater trains the policy's own weights meanwhile
        ids, logprobs, version = _complete(generator, PROMPT)
        assert (ids, logprobs, version) == (old_ids, old_logprobs, 0)  # still the copy, bit for bit
        swap = generator.swap_weights(drain=True, timeout=30)
        assert swap.version == 1
        ids, logprobs, version = _complete(generator, PROMPT)
        assert version == 1
        check_logprobs(policy.model, PROMPT, ids, logprobs)

    def test_stop_ends_serving(self, policy: Policy) -> None:
        generator = self.make_generator(policy)
        url = generator.start()
        generator.stop()
        generator.stop()  # idempotent
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{url}/models", timeout=5)


class TestLocalGenerator(GeneratorConformance):
    def make_generator(self, policy: Policy) -> Any:
        return LocalGenerator(policy, batch_window_s=0.01, default_max_tokens=8)
