"""KV-cache surgery shared by the engine and the updater (``agentbolt_torch.generation._kv``)."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from agentbolt_torch.generation._kv import cache_concat, cache_layers, pad_seq_left


def _cache(rows: int, length: int, layers: int = 2, seed: int = 0) -> DynamicCache:
    gen = torch.Generator().manual_seed(seed)
    cache = DynamicCache()
    for layer in range(layers):
        cache.update(
            torch.randn(rows, 3, length, 4, generator=gen), torch.randn(rows, 3, length, 4, generator=gen), layer
        )
    return cache


def test_cache_concat_stacks_left_padded_rows_and_consumes_the_joining_cache() -> None:
    """The running batch (a) gains the joining rows (b) under its own, both left-padded to the
    longer length; b's layers are emptied as they are stacked, so a join holds the joining rows
    once, not twice."""
    a, b = _cache(2, 5, seed=1), _cache(3, 7, seed=2)
    expected = [
        (
            torch.cat([pad_seq_left(la.keys, 7), pad_seq_left(lb.keys, 7)]),
            torch.cat([pad_seq_left(la.values, 7), pad_seq_left(lb.values, 7)]),
        )
        for la, lb in zip(cache_layers(a), cache_layers(b), strict=True)
    ]
    assert cache_concat(a, b, 7) is a
    for layer, (keys, values) in zip(cache_layers(a), expected, strict=True):
        assert torch.equal(layer.keys, keys) and torch.equal(layer.values, values)
    assert all(layer.keys is None and layer.values is None for layer in b.layers)
