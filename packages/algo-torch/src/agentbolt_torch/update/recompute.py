"""Gradient checkpointing for the policy update that keeps prompt sharing.

The update's peak memory is mostly the activations autograd saves for the backward pass: for
SmolLM2 at a 2,048-token micro-batch, more than the model, its gradients and AdamW's moments
together (docs/benchmarks.md, "Update memory"). :func:`checkpointed_layers` runs every decoder
layer under :func:`torch.utils.checkpoint.checkpoint` (non-reentrant): a layer keeps only its
input, and runs again in the backward pass to rebuild what its gradients need (about one more
forward pass of the layers).

Why not transformers' ``gradient_checkpointing_enable``: it turns the KV cache off inside
checkpointed layers, and the updater's prompt sharing (:mod:`agentbolt_torch.update.forward`)
runs responses against their prompt's cache, which saves up to ``group_size`` times the
prompt's compute. A layer appends to the cache as a side effect, so running it again would
append twice; here each checkpointed call snapshots the cache layers' state before it runs and
every run of it starts from that snapshot, so the recomputation sees exactly the cache the first
run saw. Gradients flow through the first run's graph (the recomputation only rebuilds the saved
values), so the update is the plain one's, under bf16 autocast too
(``tests/torch/test_update_recompute.py``).

What the cache holds is kept to what a recomputation needs: a snapshot holds only its own
layer's entry (a layer reads and appends only there), the keys and values the forward pass
appended are dropped when the block ends, and a recomputation's appended ones when it ends. At
the quickstart's micro-batch (float32 keys after the rotary embedding) each of these piled up
to about 230 MB until the backward pass ended.

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
    caches: dict[int, Any] = {}
    for index, layer in enumerate(layers):
        layer.forward = functools.partial(_checkpointed_forward, layer.forward, index, caches)
    try:
        yield
    finally:
        for layer in layers:
            layer.__dict__.pop("forward", None)
        for cache in caches.values():
            _release_cache(cache)


def _checkpointed_forward(
    forward: Callable[..., Any], index: int, caches: dict[int, Any], *args: Any, **kwargs: Any
) -> Any:
    import torch
    from torch.utils.checkpoint import checkpoint

    if not torch.is_grad_enabled():  # nothing is saved without gradients: nothing to checkpoint
        return forward(*args, **kwargs)
    cache = kwargs.get("past_key_values")
    snapshot = _cache_state(cache, index)
    if snapshot is not None:
        caches[id(cache)] = cache

    runs = 0

    def run(*a: Any, **kw: Any) -> Any:
        nonlocal runs
        runs += 1
        _restore_cache(cache, snapshot)  # a recomputation starts from the cache the first run saw
        try:
            return forward(*a, **kw)
        finally:
            # A recomputation (backward pass; PyTorch may end it early by raising once it has what
            # the gradients need): what it appended is saved by its own graph where needed, and
            # left in the cache it would stay alive for the rest of the backward pass.
            if runs > 1 and snapshot is not None:
                _release_layers(cache, snapshot)

    return checkpoint(run, *args, use_reentrant=False, **kwargs)


def _cache_state(cache: Any, index: int) -> dict[int, dict[str, Any]] | None:
    """The state of the cache layer the ``index``-th decoder layer reads and appends to (a layer
    touches only its own: ``past_key_values.update(..., layer_idx)``), or of every layer where the
    cache has not created that one yet. Only what the layer can change is kept alive until the
    backward pass: the other layers' keys and values are not."""
    layers = getattr(cache, "layers", None) if cache is not None else None
    if layers is None:
        return None
    chosen = [index] if index < len(layers) else range(len(layers))
    return {i: dict(layers[i].__dict__) for i in chosen}


def _restore_cache(cache: Any, state: dict[int, dict[str, Any]] | None) -> None:
    if state is None:
        return
    for i, saved in state.items():
        layer = cache.layers[i]
        layer.__dict__.clear()
        layer.__dict__.update(saved)


def _release_cache(cache: Any) -> None:
    """Drop the keys and values a forward pass left in ``cache``. The recomputations hold
    ``cache`` until the backward pass and restore each layer's snapshot before they run, so what
    the forward appended (prompt and response keys and values of every layer, in float32 after
    the rotary embedding) would otherwise stay alive, unused, until the micro-batch's backward
    pass ends: about 230 MB at the quickstart's micro-batch."""
    _release_layers(cache, range(len(getattr(cache, "layers", ()))))


def _release_layers(cache: Any, indices: Any) -> None:
    for i in indices:
        layer = cache.layers[i]
        for name in ("keys", "values"):
            if name in layer.__dict__:
                setattr(layer, name, None)
