"""Per-role LoRA adapters on vLLM: one base model, each role's adapter loaded at run time under the
role's name, each call stamped with its adapter's version, an update of one adapter reaching vLLM
without touching the other. One vLLM server (LoRA on) for the module. Logprobs are checked against
the policy's own forward pass with the adapter active (fp32, 1e-3). Marked ``vllm``: ``./dev vllm``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from vllm_support import vllm_python_or_skip, vllm_tiny  # noqa: E402

from agentbolt_torch.adapters import activate, adapter_parameters  # noqa: E402
from agentbolt_torch.policy import LoraSettings, Policy  # noqa: E402
from agentbolt_torch.serving.vllm import VLLMGenerator  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]  # a cold vLLM start: minutes on a loaded CPU
PYTHON = vllm_python_or_skip()
PROMPT = [1, 5, 9, 12, 30, 31, 40]


def _nudge(policy: Policy, adapter: str, seed: int) -> None:
    """Change one adapter's weights as its update would (B starts at zero: LoRA = base until trained)."""
    generator = torch.Generator().manual_seed(seed)
    with policy.lock, torch.no_grad():
        for p in adapter_parameters(policy.model, adapter):
            p.add_(torch.randn(p.shape, generator=generator) * 0.3)
        policy.mark_weights_changed()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Policy, VLLMGenerator]]:
    model, tokenizer = vllm_tiny(seed=0)
    adapters = {"writer": LoraSettings(r=4, alpha=8), "rewriter": LoraSettings(r=8, alpha=16)}
    policy = Policy(model, tokenizer, name="tiny", adapters=adapters, autocast_dtype=None)
    _nudge(policy, "writer", 1)
    _nudge(policy, "rewriter", 2)
    generator = VLLMGenerator(
        policy, python=PYTHON, work_dir=tmp_path_factory.mktemp("vllm-roles"), dtype="float32", max_model_len=512
    )
    generator.start()
    yield policy, generator
    generator.stop()


def _complete(generator: VLLMGenerator, model: str) -> tuple[list[int], list[float], httpx.Headers]:
    r = httpx.post(
        f"{generator.base_url}/completions",
        json={"model": model, "prompt": PROMPT, "max_tokens": 6, "temperature": 0.0, "logprobs": 0,
              "return_token_ids": True, "ignore_eos": True},
        timeout=120,
    )  # fmt: skip
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["prompt_token_ids"] == PROMPT
    return choice["token_ids"], choice["logprobs"]["token_logprobs"], r.headers


def _expected(policy: Policy, adapter: str | None, ids: list[int]) -> torch.Tensor:
    full = torch.tensor([PROMPT + ids])
    with policy.lock, torch.no_grad():
        if adapter is None:
            with policy.model.disable_adapter():
                logits = policy.model(input_ids=full).logits[0]
        else:
            activate(policy.model, adapter)
            logits = policy.model(input_ids=full).logits[0]
    logprobs = torch.log_softmax(logits[len(PROMPT) - 1 : -1].float(), -1)
    return logprobs.gather(1, torch.tensor(ids)[:, None]).squeeze(1)


def _assert_served_by(policy: Policy, adapter: str | None, ids: list[int], logprobs: list[float]) -> None:
    diff = (_expected(policy, adapter, ids) - torch.tensor(logprobs)).abs().max().item()
    assert diff < 1e-3, f"{adapter}: max logprob difference {diff}"


def test_each_role_is_served_by_its_adapter_under_its_name(served: tuple[Policy, VLLMGenerator]) -> None:
    policy, generator = served
    names = {m["id"] for m in httpx.get(f"{generator.base_url}/models", timeout=30).json()["data"]}
    assert {"tiny", "writer", "rewriter"} <= names
    outputs = {}
    for adapter in ("writer", "rewriter"):
        ids, logprobs, headers = _complete(generator, adapter)
        assert headers["x-agentbolt-policy"] == adapter
        assert headers["x-agentbolt-policy-version"] == str(policy.version_of(adapter))
        _assert_served_by(policy, adapter, ids, logprobs)
        outputs[adapter] = logprobs
    ids, logprobs, headers = _complete(generator, "tiny")  # the base model, no adapter
    assert "x-agentbolt-policy" not in headers
    _assert_served_by(policy, None, ids, logprobs)
    assert outputs["writer"] != outputs["rewriter"] != logprobs


def test_an_update_of_one_adapter_reaches_vllm_and_leaves_the_other(served: tuple[Policy, VLLMGenerator]) -> None:
    policy, generator = served
    rewriter_before = _complete(generator, "rewriter")
    writer_before = _complete(generator, "writer")
    generator.pause(drain=True, timeout=60)
    _nudge(policy, "writer", 3)
    version = policy.bump_version("writer")
    generator.resume()
    ids, logprobs, headers = _complete(generator, "writer")
    assert headers["x-agentbolt-policy-version"] == str(version) != writer_before[2]["x-agentbolt-policy-version"]
    assert logprobs != writer_before[1]
    _assert_served_by(policy, "writer", ids, logprobs)
    rewriter_after = _complete(generator, "rewriter")
    assert rewriter_after[:2] == rewriter_before[:2]  # untouched adapter: same tokens, same logprobs
    assert rewriter_after[2]["x-agentbolt-policy-version"] == rewriter_before[2]["x-agentbolt-policy-version"]


def test_calls_of_both_adapters_at_once_stay_exact(served: tuple[Policy, VLLMGenerator]) -> None:
    from concurrent.futures import ThreadPoolExecutor

    policy, generator = served
    with ThreadPoolExecutor(max_workers=6) as pool:
        futures: list[tuple[str, Any]] = [
            (name, pool.submit(_complete, generator, name)) for name in ["writer", "rewriter", "tiny"] * 2
        ]
        for name, future in futures:
            ids, logprobs, _ = future.result(timeout=300)
            _assert_served_by(policy, None if name == "tiny" else name, ids, logprobs)
