"""The two ``DynamicCache`` kinds agentbolt-torch runs on, each keeping less alive than the plain one.

:class:`AutocastDtypeCache` (the generation engine) stores keys and values in the dtype
attention reads them in. Under bf16 autocast a decoder layer hands its cache float32 keys (the
rotary embedding's ``cos``/``sin`` are float32, so they promote the bf16 projection) and bf16
values, and attention casts the keys to bf16 again whenever it reads them: PyTorch's CPU and
CUDA autocast run ``scaled_dot_product_attention`` and ``matmul`` in the autocast dtype. Storing
the keys in that dtype therefore changes no logit (the same rounding of the same values, once),
the cache takes a third less memory (4 + 2 bytes per key and value element become 2 + 2), and
decode steps stop casting every layer's whole key cache on every step. Without autocast nothing
is cast. The updater keeps float32 keys: there the cast's position would change how the
gradients of the repeated key heads are summed.

:class:`SharedPromptCache` (the updater's prompt sharing, :mod:`agentbolt_torch.update.forward`)
holds each distinct prompt's keys and values once. After :meth:`SharedPromptCache.repeat_rows`,
every layer reads them repeated to one row per transition *inside* the layer, concatenated with
the response's own keys and values, and stores neither: the repeated copies of all layers were
alive together through the response pass (about 250 MB at the quickstart's micro-batch, float32
keys), and under gradient checkpointing a checkpointed layer now keeps only the unrepeated
prompt rows. The row index lives on each cache layer, so a recomputation that restores a layer's
snapshot (:mod:`agentbolt_torch.update.recompute`) reads the prompt the way its first run did.
The logits and gradients are the plain cache's (``tests/torch/test_update_recompute.py``,
``tests/torch/test_torch_update.py``).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache

__all__ = ["AutocastDtypeCache", "SharedPromptCache"]


class AutocastDtypeCache(DynamicCache):
    """``DynamicCache`` whose :meth:`update` casts new keys and values to the active autocast dtype."""

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        device = key_states.device.type
        if torch.is_autocast_enabled(device):
            dtype = torch.get_autocast_dtype(device)
            key_states, value_states = key_states.to(dtype), value_states.to(dtype)
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)


class SharedPromptCache(DynamicCache):
    """``DynamicCache`` of distinct prompts that later passes read repeated per row (module doc)."""

    def repeat_rows(self, index: torch.Tensor) -> None:
        """From now on every layer returns its stored rows ``index`` (a prompt row per transition)
        followed by the new keys and values, and stores nothing more."""
        for layer in self.layers:
            layer.__dict__["repeat_index"] = index  # in the layer's state: checkpoint snapshots carry it

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        layer: Any = self.layers[layer_idx] if layer_idx < len(self.layers) else None
        index = layer.__dict__.get("repeat_index") if layer is not None else None
        if index is None:
            return super().update(key_states, value_states, layer_idx, *args, **kwargs)
        keys = torch.cat([layer.keys.index_select(0, index), key_states], dim=-2)
        values = torch.cat([layer.values.index_select(0, index), value_states], dim=-2)
        return keys, values
