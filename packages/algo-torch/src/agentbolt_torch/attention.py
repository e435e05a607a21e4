"""Grouped-query attention without copies when no gradient is taken (generation, reference passes).

Models with grouped-query attention (SmolLM2: 9 query heads share 3 key/value heads) run
transformers' ``sdpa`` attention, which repeats every key and value head for its query heads
(``repeat_kv``) whenever an attention mask is passed, and the engine always passes one (left
padding). In a decode step that copies the whole KV cache three times over, in every layer: for
the quickstart's 32 rows of about 420 tokens, some 0.9 GB allocated and freed per step (from the
shapes), and an attention call several times slower than PyTorch's own grouped mode
(``enable_gqa=True``) on the same inputs, which gives the same output bit for bit
(``benchmarks/attention.py`` measures both; docs/benchmarks.md has its figures).

:func:`use_grouped_attention` registers :func:`grouped_sdpa_forward` under :data:`ATTENTION_NAME`
through transformers' documented extension point (``AttentionInterface`` and
``AttentionMaskInterface``, the mask being ``sdpa``'s) and switches a model that runs ``sdpa`` to
it. With gradients enabled it is transformers' ``sdpa`` unchanged, so an update computes and
differentiates exactly what it did before; only passes without gradients (the engine's
``inference_mode``, the updater's reference and recomputed logprobs) take the grouped kernel.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["ATTENTION_NAME", "grouped_sdpa_forward", "use_grouped_attention"]

logger = logging.getLogger(__name__)

ATTENTION_NAME = "agentbolt_sdpa"
"""The attention implementation name the policy's model runs under (``sdpa`` plus the grouped mode)."""


def grouped_sdpa_forward(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' ``sdpa`` attention, but without gradients and with a mask, key/value heads are
    shared by their query heads inside the kernel (``enable_gqa``) instead of copied."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = int(getattr(module, "num_key_value_groups", 1) or 1)
    if groups == 1 or attention_mask is None or torch.is_grad_enabled() or kwargs.get("output_attentions"):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=False, enable_gqa=True
    )
    return out.transpose(1, 2).contiguous(), None


def use_grouped_attention(model: Any) -> bool:
    """Switch ``model`` from ``sdpa`` to :data:`ATTENTION_NAME`; ``False`` (unchanged) for any
    other attention implementation, or a model that cannot switch."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) != "sdpa" or not hasattr(model, "set_attn_implementation"):
        return False
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION_NAME, grouped_sdpa_forward)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)
    try:
        model.set_attn_implementation(ATTENTION_NAME)
    except (ValueError, KeyError, TypeError) as exc:  # a model class that refuses custom implementations
        logger.info("keeping sdpa attention: %s", exc)
        return False
    return True
