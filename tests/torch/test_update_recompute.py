"""Gradient checkpointing in the policy update (agentbolt_torch.update.recompute): that the
layers keep nothing and run again, that prompt sharing stays on, and that the update is the
plain one's under bf16 autocast (the quickstart's setting).

The value checks without autocast are in test_torch_update.py
(``test_gradient_checkpointing_gives_the_same_update``, the chunked-head test's checkpointed cases).
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from agentbolt.types import Transition
from agentbolt_torch.models import tiny_model
from agentbolt_torch.policy import Policy
from agentbolt_torch.update.recompute import checkpointed_layers, decoder_layers
from agentbolt_torch.update.updater import PolicyUpdater, UpdateConfig


def policy(*, autocast: bool = False) -> Policy:
    model, tokenizer = tiny_model(seed=0)
    return Policy(model, tokenizer, name="tiny", autocast_dtype="bfloat16" if autocast else None)


def groups(n_groups: int = 3, group: int = 4, prompt_len: int = 30) -> list[Transition]:
    """GRPO-shaped rows: ``group`` responses of varied length to each of ``n_groups`` prompts."""
    rng = random.Random(0)
    rows = []
    for g in range(n_groups):
        prompt = [rng.randrange(3, 200) for _ in range(prompt_len)]
        for k in range(group):
            n = rng.randint(2, 9)
            rows.append(
                Transition(
                    rollout_id=f"g{g}-{k}",
                    group_id=f"g{g}",
                    index=0,
                    prompt_ids=prompt,
                    response_ids=[rng.randrange(3, 200) for _ in range(n)],
                    response_logprobs=[-3.0] * n,
                    advantage=rng.uniform(-1, 1),
                )
            )
    return rows


class MatmulCount(TorchDispatchMode):
    """Counts the matrix products dispatched while active (the forward's or the backward's)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func.overloadpacket.__name__
        if name in ("mm", "addmm", "bmm"):
            self.calls[name] += 1
        return func(*args, **(kwargs or {}))


def matmuls(checkpointing: bool) -> tuple[int, int]:
    """Matrix products in one forward and in its backward pass."""
    from agentbolt_torch.update.batches import prepare_items
    from agentbolt_torch.update.forward import response_logprobs

    p = policy()
    p.model.train()
    items = prepare_items(groups(), p.max_model_len)
    with checkpointed_layers(p.model, checkpointing):
        with MatmulCount() as forward:
            logp, _, _ = response_logprobs(p, p.model, items, share_prompts=True, with_entropy=False)
        with MatmulCount() as backward:
            logp.sum().backward()
    return sum(forward.calls.values()), sum(backward.calls.values())


def test_checkpointed_layers_run_again_in_the_backward_pass() -> None:
    off_forward, off_backward = matmuls(False)
    on_forward, on_backward = matmuls(True)
    assert off_forward == on_forward > 0
    # the layers' products run once more in the backward pass, the output head's do not (its
    # chunks are recomputed with or without: update_forward's own checkpoint)
    assert off_backward < on_backward < off_backward + off_forward


def saved_bytes(checkpointing: bool) -> int:
    """Bytes autograd saves for the backward pass outside checkpointed regions in one forward."""
    from agentbolt_torch.update.batches import prepare_items
    from agentbolt_torch.update.forward import response_logprobs

    p = policy()
    p.model.train()
    items = prepare_items(groups(), p.max_model_len)
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with checkpointed_layers(p.model, checkpointing), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        response_logprobs(p, p.model, items, share_prompts=True, with_entropy=False)
    return sum(seen.values())


def test_checkpointed_layers_save_no_activation_of_their_own() -> None:
    off, on = saved_bytes(False), saved_bytes(True)
    assert on < off / 3


def test_the_forwards_keys_and_values_are_freed_before_the_backward_pass() -> None:
    """The keys and values the response pass made (its prompt's rows repeated per transition,
    followed by its own) are garbage once the forward ends: only the prompts' own rows stay, for
    the recomputations, and the backward pass still gives the plain gradients. (Before, every
    layer's repeated prompt rows stayed in the layers' snapshots until the backward pass.)"""
    import gc

    from agentbolt_torch.update.batches import prepare_items
    from agentbolt_torch.update.forward import response_logprobs

    grads = {}
    for checkpointing in (False, True):
        p = policy()
        p.model.train()
        items = prepare_items(groups(), p.max_model_len)
        with checkpointed_layers(p.model, checkpointing), CacheOutputs() as made:
            logp, _, _ = response_logprobs(p, p.model, items, share_prompts=True, with_entropy=False)
        gc.collect()
        if checkpointing:
            per_transition = [ref for ref, rows in made.outputs if rows == len(items)]
            assert per_transition and all(ref.expired() for ref in per_transition)
            assert any(not ref.expired() for ref, rows in made.outputs if rows < len(items))  # the prompts'
        logp.sum().backward()
        grads[checkpointing] = [param.grad.clone() for param in p.model.parameters()]
    for plain, recomputed in zip(grads[False], grads[True], strict=True):
        torch.testing.assert_close(recomputed, plain, rtol=1e-5, atol=1e-6)


class CacheOutputs(TorchDispatchMode):
    """Weak references to the key/value tensors (4-D ``cat`` and ``index_select`` outputs) made while
    active, with their rows."""

    def __init__(self) -> None:
        super().__init__()
        self.outputs: list[tuple[Any, int]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        from torch.multiprocessing.reductions import StorageWeakRef

        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ in ("cat", "index_select") and out.dim() == 4:  # [rows, heads, seq, dim]
            self.outputs.append((StorageWeakRef(out.untyped_storage()), out.shape[0]))
        return out


class LiveCacheOutputs(TorchDispatchMode):
    """The most key/value tensors a cache's ``cat`` made that were alive at once while active."""

    def __init__(self) -> None:
        super().__init__()
        self.alive: list[Any] = []
        self.most = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        from torch.multiprocessing.reductions import StorageWeakRef

        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ == "cat" and out.dim() == 4:  # [rows, heads, seq, dim]
            self.alive.append(StorageWeakRef(out.untyped_storage()))
        self.alive = [ref for ref in self.alive if not ref.expired()]
        self.most = max(self.most, len(self.alive))
        return out


def test_a_recomputation_keeps_only_its_own_layers_keys_and_values() -> None:
    """In the backward pass each layer runs again and appends to the cache once more; PyTorch may
    end that run early, by raising. What it appended must go with it, not pile up layer after
    layer until the backward pass ends (it did: every layer's, about 230 MB at the quickstart's
    micro-batch)."""
    from agentbolt_torch.update.batches import prepare_items
    from agentbolt_torch.update.forward import response_logprobs

    model, tokenizer = tiny_model(seed=0, num_layers=4)
    p = Policy(model, tokenizer, name="tiny", autocast_dtype=None)
    p.model.train()
    items = prepare_items(groups(), p.max_model_len)
    with checkpointed_layers(p.model, True):
        logp, _, _ = response_logprobs(p, p.model, items, share_prompts=True, with_entropy=False)
    with LiveCacheOutputs() as live:
        logp.sum().backward()
    assert live.most == 2  # the keys and the values of the layer being recomputed, 8 before the fix


def test_prompt_sharing_stays_on_under_checkpointing() -> None:
    rows = groups(n_groups=3, group=4, prompt_len=60)
    # one group fits a micro-batch of 120 padded tokens only if its prompt counts once
    counts = {}
    for checkpointing, share in ((False, True), (True, True), (False, False)):
        updater = PolicyUpdater(
            policy(), UpdateConfig(micro_batch_tokens=120, share_prompts=share, gradient_checkpointing=checkpointing)
        )
        counts[(checkpointing, share)] = updater.update(rows).micro_batches
    assert counts[(False, True)] == counts[(True, True)] == 3
    assert counts[(False, False)] > 3


def test_bf16_autocast_update_is_the_plain_ones_exactly() -> None:
    """Under bf16 autocast (the quickstart's setting) with shared prompts: gradients flow through
    the first run's graph, the recomputation only rebuilds saved values, so the weight change is
    the plain update's to the bit."""
    results = []
    for checkpointing in (False, True):
        p = policy(autocast=True)
        before = {k: v.detach().clone() for k, v in p.model.named_parameters()}
        PolicyUpdater(p, UpdateConfig(lr=1e-2, gradient_checkpointing=checkpointing)).update(groups())
        results.append({k: v.detach() - before[k] for k, v in p.model.named_parameters()})
    assert max(d.abs().max().item() for d in results[0].values()) > 1e-4
    assert all(torch.equal(results[0][k], results[1][k]) for k in results[0])


def test_layers_are_restored_even_when_the_forward_fails() -> None:
    p = policy()
    layers = decoder_layers(p.model)
    shadowed = []

    def fail() -> None:
        with checkpointed_layers(p.model, "full"):
            shadowed.extend("forward" in layer.__dict__ for layer in layers)
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        fail()
    assert shadowed == [True] * len(layers)
    assert not any("forward" in layer.__dict__ for layer in layers)
