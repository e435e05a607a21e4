"""KV-cache helpers shared by the generation engine and the updater (transformers >= 5 ``DynamicCache``).

Every operation rebinds the layer tensors (``index_select``, ``cat``, slicing) instead of writing
into them, so they are differentiable: the updater runs responses against an expanded prompt
cache with gradients flowing back into the prompt's forward pass.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def cache_layers(cache: Any) -> list[Any]:
    """The initialised layers of a ``DynamicCache`` (each with ``keys`` / ``values``)."""
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise RuntimeError(
            "unsupported transformers cache layout (no DynamicCache.layers); agentbolt-torch needs transformers>=5"
        )
    return [layer for layer in layers if getattr(layer, "is_initialized", True) and hasattr(layer, "keys")]


def cache_select(cache: Any, index: torch.Tensor) -> None:
    """Keep (or repeat) the batch rows ``index`` of every layer."""
    for layer in cache_layers(cache):
        layer.keys = layer.keys.index_select(0, index)
        layer.values = layer.values.index_select(0, index)


def cache_trim_left(cache: Any, start: int) -> None:
    """Drop the first ``start`` sequence columns of every layer."""
    for layer in cache_layers(cache):
        layer.keys = layer.keys[:, :, start:, :]
        layer.values = layer.values[:, :, start:, :]


def pad_seq_left(x: torch.Tensor, length: int) -> torch.Tensor:
    """Left-pad a ``[batch, heads, seq, dim]`` tensor with zeros to ``length`` columns."""
    import torch

    missing = length - x.shape[2]
    if missing <= 0:
        return x
    pad = x.new_zeros((x.shape[0], x.shape[1], missing, x.shape[3]))
    return torch.cat([pad, x], dim=2)


def pad_left(mask: torch.Tensor, length: int) -> torch.Tensor:
    """Left-pad a ``[batch, seq]`` attention mask with zeros to ``length`` columns."""
    import torch

    missing = length - mask.shape[1]
    if missing <= 0:
        return mask
    return torch.cat([mask.new_zeros((mask.shape[0], missing)), mask], dim=1)


def cache_concat(a: Any, b: Any, length: int) -> Any:
    """Stack ``b``'s rows under ``a``'s (both left-padded to ``length`` columns), into ``a``.

    ``b`` is consumed: each of its layers is emptied once stacked, so the memory of the rows
    being added is released layer by layer instead of staying alive beside the stacked copy
    until ``b`` is dropped (the engine's joins peaked at about the running batch plus twice
    the joining rows; now once)."""
    import torch

    for la, lb in zip(cache_layers(a), cache_layers(b), strict=True):
        keys_b, values_b = pad_seq_left(lb.keys, length), pad_seq_left(lb.values, length)
        lb.keys = lb.values = None
        keys_a, values_a = pad_seq_left(la.keys, length), pad_seq_left(la.values, length)
        la.keys = torch.cat([keys_a, keys_b.to(keys_a.dtype)], dim=0)
        la.values = torch.cat([values_a, values_b.to(values_a.dtype)], dim=0)
        del keys_a, values_a, keys_b, values_b
    return a
