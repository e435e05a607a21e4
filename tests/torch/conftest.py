"""Fixtures for agentbolt-torch: a tiny random Llama, its policy, engine and HTTP server."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from agentbolt_torch.generation.engine import GenerationEngine  # noqa: E402
from agentbolt_torch.models import tiny_model  # noqa: E402
from agentbolt_torch.policy import Policy  # noqa: E402
from agentbolt_torch.serving.server import PolicyServer  # noqa: E402


def reference_logprobs(model: Any, prompt_ids: Sequence[int], response_ids: Sequence[int]) -> torch.Tensor:
    """Log-softmax of one plain fp32 forward pass over prompt + response: [len(response), vocab]."""
    ids = torch.tensor([list(prompt_ids) + list(response_ids)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    return torch.log_softmax(logits[len(prompt_ids) - 1 : -1], dim=-1)


def assert_logprobs_match(
    model: Any, prompt_ids: Sequence[int], response_ids: Sequence[int], logprobs: Sequence[float], tol: float = 1e-3
) -> None:
    """The reported logprobs equal the forward pass's logprobs of the same tokens."""
    assert len(logprobs) == len(response_ids) > 0
    ref = reference_logprobs(model, prompt_ids, response_ids)
    expected = ref.gather(1, torch.tensor(response_ids)[:, None]).squeeze(1)
    diff = (expected - torch.tensor(logprobs)).abs().max().item()
    assert diff < tol, f"max logprob difference {diff}"


@pytest.fixture(scope="session")
def tiny() -> tuple[Any, Any]:
    """A tiny random model and its offline tokenizer (shared: tests must not train it)."""
    return tiny_model(seed=0)


@pytest.fixture(scope="module")
def fp32_policy(tiny: tuple[Any, Any]) -> Policy:
    """A policy over the shared tiny model without autocast, so logprobs compare at 1e-3."""
    model, tokenizer = tiny
    return Policy(model, tokenizer, name="tiny", autocast_dtype=None)


@pytest.fixture(scope="module")
def engine(fp32_policy: Policy) -> Iterator[GenerationEngine]:
    eng = GenerationEngine(fp32_policy, batch_window_s=0.05, max_batch_size=16, default_max_tokens=24)
    with eng:
        yield eng


@pytest.fixture(scope="module")
def server(engine: GenerationEngine) -> Iterator[PolicyServer]:
    with PolicyServer(engine) as srv:
        yield srv


@pytest.fixture
def client(server: PolicyServer) -> Any:
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="session")
def check_logprobs() -> Any:
    """``check_logprobs(model, prompt_ids, response_ids, logprobs, tol=1e-3)``."""
    return assert_logprobs_match
