"""The forward passes of the policy update: per-token logprobs of the responses of a micro-batch.

Sequences are laid out like in generation: prompts left-padded to a common length so all
responses start at the same column, responses right-padded; ``position_ids = cumsum(mask) - 1``.
Only response positions go through the output head, and **in chunks** of at most
:data:`LOGIT_CHUNK_BYTES` of fp32 logits (:func:`_head_logprobs`): each chunk's logits are
recomputed in the backward pass instead of kept (``torch.utils.checkpoint``), so a micro-batch
never holds its full ``[rows, response, vocab]`` logits, their softmax and their gradient at
once (SmolLM2's 49,152-token vocabulary made those the largest buffers of the update). The
recomputation costs one extra output-head product per response token in the backward pass.
With prompt sharing (``UpdateConfig.share_prompts``), transitions with the same prompt (a GRPO
group, packed together by :func:`~agentbolt_torch.update.batches.micro_batches`) run their
prompt once with a KV cache, and the responses run against the cache rows of their prompt:
gradients reach the prompt's activations through the cache.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from .batches import PreparedTransition

if TYPE_CHECKING:
    import torch

    from ..policy import Policy

__all__ = ["LOGIT_CHUNK_BYTES", "response_logprobs"]


LOGIT_CHUNK_BYTES = 64 * 2**20
"""Most fp32 logits one chunk of the output head holds (64 MiB: 341 positions of a 49k vocabulary)."""


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
    micro-batch whose transitions share prompts runs each prompt once (:func:`_shared_prompt_hidden`).
    Entropies carry gradients only with ``entropy_grad``.
    """
    head = _output_head(model)
    if head is None:  # an output head with extra steps (e.g. logit soft-capping): the model's own logits
        logits, targets, processed = _response_outputs(policy, model, micro, share_prompts, hidden=False)
        logp, entropy = _logprobs_from_logits(logits, targets, logit_temperature, with_entropy, entropy_grad)
        return logp, entropy, processed
    hidden, targets, processed = _response_outputs(policy, model, micro, share_prompts, hidden=True)
    logp, entropy = _head_logprobs(
        policy, head, hidden, targets, micro, logit_temperature, with_entropy=with_entropy, entropy_grad=entropy_grad
    )
    return logp, entropy, processed


def _output_head(model: Any) -> Any:
    """The model's output projection when its logits are exactly ``head(last hidden state)``, else ``None``."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    config = getattr(base, "config", None)
    if head is None or not hasattr(base, "get_decoder") or getattr(head, "bias", None) is not None:
        return None
    if getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None) not in (None, 1, 1.0):
        return None
    return head


def _decoder(model: Any) -> Any:
    """The transformer under the output head (``peft`` adapters, injected in its layers, stay active)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.get_decoder()


def _logprobs_from_logits(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool, entropy_grad: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    import torch

    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    log_z = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - log_z
    entropy = None
    if with_entropy:
        with contextlib.nullcontext() if entropy_grad else torch.no_grad():
            probs = torch.softmax(logits, dim=-1)
            entropy = log_z - (probs * logits).sum(-1)
    return logp, entropy


def _head_logprobs(
    policy: Policy,
    head: Any,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    micro: list[PreparedTransition],
    temperature: float,
    *,
    with_entropy: bool,
    entropy_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprobs (and entropies) [B, R] from the hidden states [B, R, H] predicting each response
    token, through ``head`` in chunks of response positions; padding positions are skipped (0)."""
    import torch
    from torch.utils.checkpoint import checkpoint

    B, R = targets.shape
    lengths = torch.tensor([len(it.response) for it in micro], device=targets.device)
    valid = (torch.arange(R, device=targets.device)[None, :] < lengths[:, None]).reshape(-1)
    index = valid.nonzero().squeeze(-1)
    flat_hidden = hidden.reshape(B * R, -1).index_select(0, index)
    flat_targets = targets.reshape(-1).index_select(0, index)
    vocab = int(head.weight.shape[0])
    chunk = max(1, LOGIT_CHUNK_BYTES // (4 * vocab))
    recompute = torch.is_grad_enabled() and flat_hidden.requires_grad

    def piece(h: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with policy.autocast():
            logits = head(h)
        logp, entropy = _logprobs_from_logits(logits, target, temperature, with_entropy, entropy_grad)
        return logp, entropy if entropy is not None else logp.new_zeros(())

    logps, entropies = [], []
    for start in range(0, flat_hidden.shape[0], chunk):
        h, target = flat_hidden[start : start + chunk], flat_targets[start : start + chunk]
        logp, entropy = checkpoint(piece, h, target, use_reentrant=False) if recompute else piece(h, target)
        logps.append(logp)
        entropies.append(entropy)
    logp = hidden.new_zeros(B * R, dtype=torch.float32).index_put(
        (index,), torch.cat(logps) if logps else hidden.new_zeros(0)
    )
    entropy = None
    if with_entropy:
        values = torch.cat(entropies) if entropies else hidden.new_zeros(0)
        entropy = hidden.new_zeros(B * R, dtype=torch.float32).index_put((index,), values.to(torch.float32))
        entropy = entropy.reshape(B, R)
    return logp.reshape(B, R), entropy


def _response_outputs(
    policy: Policy, model: Any, micro: list[PreparedTransition], share_prompts: bool, *, hidden: bool
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The last hidden states [B, R, H] (``hidden``) or the logits [B, R, V] predicting each
    response token, the targets [B, R], tokens processed."""
    groups: dict[tuple[int, ...], int] = {}
    rows = [groups.setdefault(it.prompt_key, len(groups)) for it in micro]
    if not share_prompts or len(groups) == len(micro):
        ids, attn, positions, targets = _batch_tensors(policy, micro)
        R = targets.shape[1]
        with policy.autocast():
            if hidden:
                out = _decoder(model)(input_ids=ids, attention_mask=attn, position_ids=positions, use_cache=False)
                states = out.last_hidden_state[:, -(R + 1) : -1, :]
            else:
                out = model(
                    input_ids=ids, attention_mask=attn, position_ids=positions, logits_to_keep=R + 1, use_cache=False
                )
                states = out.logits[:, :-1, :]
        return states, targets, int(attn.sum())
    return _shared_prompt_outputs(policy, model, micro, list(groups), rows, hidden=hidden)


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


def _shared_prompt_outputs(
    policy: Policy,
    model: Any,
    micro: list[PreparedTransition],
    prompts: list[tuple[int, ...]],
    rows: list[int],
    *,
    hidden: bool,
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Like the plain pass, but each distinct prompt runs once and responses use its KV cache.

    Pass 1: the distinct ``prompts``, left-padded to P, with a fresh cache; the last
    position's output predicts every response's first token. Pass 2: the responses minus
    their last token, right-padded, attend to their prompt's cache rows, which each layer
    repeats to one per transition as it runs (``prompts[rows[i]]`` is transition i's prompt;
    :class:`~agentbolt_torch._kv_caches.SharedPromptCache`), with mask = prompt mask + response
    mask and positions continuing from each prompt's length.
    Returns hidden states (``hidden``) or logits, as :func:`_response_outputs`.
    """
    import torch

    from .._kv_caches import SharedPromptCache

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
    cache = SharedPromptCache(config=policy.base_model.config)
    forward = _decoder(model) if hidden else model
    keep: dict[str, Any] = {} if hidden else {"logits_to_keep": 1}

    def last(out: Any, sl: slice) -> torch.Tensor:
        return out.last_hidden_state[:, sl, :] if hidden else out.logits[:, sl, :]

    with policy.autocast():
        out = forward(
            input_ids=prompt_ids.to(device),
            attention_mask=prompt_mask,
            position_ids=prompt_positions.to(device),
            past_key_values=cache,
            use_cache=True,
            **keep,
        )
        states = last(out, slice(-1, None)).index_select(0, index)
        if R > 1:
            cache.repeat_rows(index)
            lengths = prompt_mask.sum(-1).index_select(0, index)
            inputs, inputs_mask = response_ids[:, :-1].to(device), response_mask[:, :-1].to(device)
            positions = lengths[:, None] + torch.arange(R - 1, device=device)[None, :]
            out = forward(
                input_ids=inputs,
                attention_mask=torch.cat([prompt_mask.index_select(0, index), inputs_mask], dim=1),
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
            )
            states = torch.cat([states, last(out, slice(None))], dim=1)
    processed = sum(len(p) for p in prompts) + int(response_mask.sum())
    return states, response_ids.to(device), processed
