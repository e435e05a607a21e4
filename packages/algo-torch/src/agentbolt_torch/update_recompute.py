"""Gradient checkpointing for the policy update that keeps prompt sharing.

The update's peak memory is mostly the activations autograd saves for the backward pass: for
SmolLM2 at a 2,048-token micro-batch, more than the model, its gradients and AdamW's moments
together (docs/benchmarks.md, "Update memory"). :func:`checkpointed_layers` runs every decoder
layer under :func:`torch.utils.checkpoint.checkpoint` (non-reentrant): a layer keeps only its
input, and runs again in the backward pass to rebuild what its gradients need (about one more
forward pass of the layers).

Why not transformers' ``gradient_checkpointing_enable``: it turns the KV cache off inside
checkpointed layers, and the updater's prompt sharing (:mod:`agentbolt_torch.update_forward`)
runs responses against their prompt's cache, which saves up to ``group_size`` times the
prompt's compute. A layer appends to the cache as a side effect, so running it again would
append twice; here each checkpointed call snapshots the cache layers' state before it runs and
every run of it starts from that snapshot, so the recomputation sees exactly the cache the first
run saw. Gradients flow through the first run's graph (the recomputation only rebuilds the saved
values), so the update is the plain one's, under bf16 autocast too
(``tests/torch/test_update_recompute.py``).

PyTorch's *selective* checkpointing (keep the matrix products' outputs, recompute only the
element-wise work) was tried on the quickstart in a scratch version and left out: about as much
memory as this and a slower update (its per-operator dispatch in Python, and weight casts it
cannot share across the prompt and response passes).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["checkpointed_layers", "decoder_layers"]


def decoder_layers(model: Any) -> list[Any]:
    """The transformer blocks of a causal LM (under ``peft`` adapters too), in order."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder = base.get_decoder() if hasattr(base, "get_decoder") else None
    layers = getattr(decoder, "layers", None) if decoder is not None else None
    if layers is None:
        raise TypeError(
            f"{type(base).__name__} has no decoder layers to checkpoint (expected model.get_decoder().layers); "
            "use UpdateConfig(gradient_checkpointing=False)"
        )
    return list(layers)


@contextlib.contextmanager
def checkpointed_layers(model: Any, enabled: bool = True) -> Iterator[None]:
    """Within the block, every decoder layer of ``model`` runs checkpointed (module doc).

    ``enabled=False`` changes nothing. The layers' ``forward`` are shadowed by instance
    attributes and restored on exit, however the block ends.
    """
    if not enabled:
        yield
        return
    layers = decoder_layers(model)
    for layer in layers:
        layer.forward = functools.partial(_checkpointed_forward, layer.forward)
    try:
        yield
    finally:
        for layer in layers:
            layer.__dict__.pop("forward", None)


def _checkpointed_forward(forward: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    import torch
    from torch.utils.checkpoint import checkpoint

    if not torch.is_grad_enabled():  # nothing is saved without gradients: nothing to checkpoint
        return forward(*args, **kwargs)
    cache = kwargs.get("past_key_values")
    snapshot = _cache_state(cache)

    def run(*a: Any, **kw: Any) -> Any:
        _restore_cache(cache, snapshot)  # a recomputation starts from the cache the first run saw
        return forward(*a, **kw)

    return checkpoint(run, *args, use_reentrant=False, **kwargs)


def _cache_state(cache: Any) -> list[dict[str, Any]] | None:
    layers = getattr(cache, "layers", None) if cache is not None else None
    return None if layers is None else [dict(layer.__dict__) for layer in layers]


def _restore_cache(cache: Any, state: list[dict[str, Any]] | None) -> None:
    if state is None:
        return
    for layer, saved in zip(cache.layers, state, strict=True):
        layer.__dict__.clear()
        layer.__dict__.update(saved)
