"""The forward passes of the policy update: per-token logprobs of the responses of a micro-batch.

Sequences are laid out like in generation: prompts left-padded to a common length so all
responses start at the same column, responses right-padded; ``position_ids = cumsum(mask) - 1``.
Logits are computed only for response positions (``logits_to_keep``), which keeps memory small.
With prompt sharing (``UpdateConfig.share_prompts``), transitions with the same prompt (a GRPO
group, packed together by :func:`~agentbolt_torch.update_batches.micro_batches`) run their
prompt once with a KV cache, and the responses run against the cache rows of their prompt:
gradients reach the prompt's activations through the cache.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from ._kv import cache_select
from .update_batches import PreparedTransition

if TYPE_CHECKING:
    import torch

    from .policy import Policy

__all__ = ["response_logprobs"]


def response_logprobs(
    policy: Policy,
    model: Any,
    micro: list[PreparedTransition],
    *,
    share_prompts: bool,
    logit_temperature: float = 1.0,
    with_entropy: bool,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """Per-token logprobs [B, R] of the responses under ``model`` (and entropies), and tokens processed.

    ``model`` is the policy's model, its reference, or the policy's model with adapters off;
    ``policy`` gives the device, the pad token and the autocast. With ``share_prompts``, a
    micro-batch whose transitions share prompts runs each prompt once (:func:`_shared_prompt_logits`).
    Entropies carry gradients only with ``entropy_grad``.
    """
    import torch

    logits, targets, processed = _response_logits(policy, model, micro, share_prompts)
    logits = logits.float()
    if logit_temperature != 1.0:
        logits = logits / logit_temperature
    log_z = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - log_z
    entropy = None
    if with_entropy:
        ctx = contextlib.nullcontext() if entropy_grad else torch.no_grad()
        with ctx:
            probs = torch.softmax(logits, dim=-1)
            entropy = log_z - (probs * logits).sum(-1)
    return logp, entropy, processed


def _response_logits(
    policy: Policy, model: Any, micro: list[PreparedTransition], share_prompts: bool
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Logits [B, R, V] predicting each response token, the targets [B, R], tokens processed."""
    groups: dict[tuple[int, ...], int] = {}
    rows = [groups.setdefault(it.prompt_key, len(groups)) for it in micro]
    if not share_prompts or len(groups) == len(micro):
        ids, attn, positions, targets = _batch_tensors(policy, micro)
        R = targets.shape[1]
        with policy.autocast():
            out = model(
                input_ids=ids, attention_mask=attn, position_ids=positions, logits_to_keep=R + 1, use_cache=False
            )
        return out.logits[:, :-1, :], targets, int(attn.sum())
    return _shared_prompt_logits(policy, model, micro, list(groups), rows)


def _batch_tensors(policy: Policy, micro: list[PreparedTransition]) -> tuple[torch.Tensor, ...]:
    """Prompts left-padded to a common length P, responses right-padded to R."""
    import torch

    device = policy.device
    pad = policy.tokenizer.pad_token_id or 0
    P = max(len(it.prompt) for it in micro)
    R = max(max(len(it.response) for it in micro), 1)
    ids = torch.full((len(micro), P + R), pad, dtype=torch.long)
    attn = torch.zeros((len(micro), P + R), dtype=torch.long)
    targets = torch.full((len(micro), R), pad, dtype=torch.long)
    for i, it in enumerate(micro):
        seq = it.prompt + it.response
        start = P - len(it.prompt)
        ids[i, start : start + len(seq)] = torch.tensor(seq)
        attn[i, start : start + len(seq)] = 1
        if it.response:
            targets[i, : len(it.response)] = torch.tensor(it.response)
    positions = (attn.cumsum(-1) - 1).clamp(min=0)
    return ids.to(device), attn.to(device), positions.to(device), targets.to(device)


def _shared_prompt_logits(
    policy: Policy, model: Any, micro: list[PreparedTransition], prompts: list[tuple[int, ...]], rows: list[int]
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Like the plain pass, but each distinct prompt runs once and responses use its KV cache.

    Pass 1: the distinct ``prompts``, left-padded to P, with a fresh cache; the last
    position's logits predict every response's first token. The cache rows are then
    repeated to one per transition (``prompts[rows[i]]`` is transition i's prompt). Pass 2: the
    responses minus their last token, right-padded, attend to their prompt's cache rows
    (mask = prompt mask + response mask, positions continue from each prompt's length).
    """
    import torch
    from transformers import DynamicCache

    device = policy.device
    pad = policy.tokenizer.pad_token_id or 0
    n_prompts = len(prompts)
    P = max(len(p) for p in prompts)
    R = max(max(len(it.response) for it in micro), 1)
    prompt_ids = torch.full((n_prompts, P), pad, dtype=torch.long)
    prompt_mask = torch.zeros((n_prompts, P), dtype=torch.long)
    for g, prompt in enumerate(prompts):
        prompt_ids[g, P - len(prompt) :] = torch.tensor(prompt)
        prompt_mask[g, P - len(prompt) :] = 1
    prompt_positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
    response_ids = torch.full((len(micro), R), pad, dtype=torch.long)
    response_mask = torch.zeros((len(micro), R), dtype=torch.long)
    for i, it in enumerate(micro):
        response_ids[i, : len(it.response)] = torch.tensor(it.response)
        response_mask[i, : len(it.response)] = 1
    index = torch.tensor(rows, device=device)
    prompt_mask = prompt_mask.to(device)
    cache = DynamicCache(config=policy.base_model.config)
    with policy.autocast():
        out = model(
            input_ids=prompt_ids.to(device),
            attention_mask=prompt_mask,
            position_ids=prompt_positions.to(device),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        logits = out.logits[:, -1:, :].index_select(0, index)
        if R > 1:
            cache_select(cache, index)
            lengths = prompt_mask.sum(-1).index_select(0, index)
            inputs, inputs_mask = response_ids[:, :-1].to(device), response_mask[:, :-1].to(device)
            positions = lengths[:, None] + torch.arange(R - 1, device=device)[None, :]
            out = model(
                input_ids=inputs,
                attention_mask=torch.cat([prompt_mask.index_select(0, index), inputs_mask], dim=1),
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
            )
            logits = torch.cat([logits, out.logits], dim=1)
    processed = sum(len(p) for p in prompts) + int(response_mask.sum())
    return logits, response_ids.to(device), processed
