"""Per-row token sampling for the engine's batches (inverse-CDF sampling with per-row temperature,
top-p, top-k and seeds) and the stop-string scan."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .engine_io import LogprobsMode, SamplingParams

if TYPE_CHECKING:
    import torch

__all__ = ["find_stop", "held_back", "sample_tokens"]


def sample_tokens(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
    default_generator: torch.Generator | None = None,
    logprobs_mode: LogprobsMode = "raw",
) -> tuple[torch.Tensor, torch.Tensor, list[list[tuple[int, float]]] | None]:
    """Sample one token per row of ``logits`` [rows, vocab] with per-row settings.

    Sampling is by inverse CDF: one uniform number per row, searched in the row's cumulative
    distribution (cheap: no per-vocabulary-entry random numbers). Rows with their own generator
    (a seeded request) draw their own number, so a seeded request gives the same tokens whatever
    else is in the batch.

    Returns:
        ``(tokens [rows], logprobs [rows], top)``: ``top[i]`` lists the ``params[i].top_logprobs``
        most likely ``(token_id, logprob)`` pairs, or ``top`` is ``None`` when no row wants them.
    """
    import torch

    logits = logits.float()
    vocab = logits.shape[-1]
    raw = torch.log_softmax(logits, dim=-1)
    greedy = [p.greedy for p in params]
    processed = raw
    needs_processing = any(
        not g and (p.temperature != 1.0 or p.top_p < 1.0 or p.top_k > 0) for p, g in zip(params, greedy, strict=True)
    )
    if needs_processing:
        temps = torch.tensor([1.0 if g else p.temperature for p, g in zip(params, greedy, strict=True)])
        scaled = logits / temps.to(logits.device)[:, None]
        top_ks = [p.top_k if 0 < p.top_k < vocab else 0 for p in params]
        if any(top_ks):
            kmax = max(top_ks)
            kth = scaled.topk(kmax, dim=-1).values
            for i, k in enumerate(top_ks):
                if k:
                    scaled[i].masked_fill_(scaled[i] < kth[i, k - 1], float("-inf"))
        top_p_rows = [i for i, p in enumerate(params) if p.top_p < 1.0 and not greedy[i]]
        if top_p_rows:
            index = torch.tensor(top_p_rows, device=logits.device)
            sub = scaled.index_select(0, index)
            sorted_logits, order = sub.sort(dim=-1, descending=True)
            probs = sorted_logits.softmax(dim=-1)
            top_p = torch.tensor([params[i].top_p for i in top_p_rows], device=logits.device)
            # drop a token when the mass before it already reaches top_p (the first is always kept)
            drop_sorted = (probs.cumsum(dim=-1) - probs) >= top_p[:, None]
            drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
            scaled[index] = sub.masked_fill(drop, float("-inf"))
        processed = torch.log_softmax(scaled, dim=-1)
    # Inverse-CDF sampling: one uniform draw per row (a seeded row draws from its own generator,
    # so its tokens do not depend on the rest of the batch), then a search in the row's CDF.
    uniforms = torch.zeros(len(params), device=logits.device)
    shared = [i for i, g in enumerate(generators) if g is None and not greedy[i]]
    if shared:
        draws = torch.rand(len(shared), device=logits.device, generator=default_generator)
        uniforms[torch.tensor(shared, device=logits.device)] = draws
    for i, generator in enumerate(generators):
        if generator is not None and not greedy[i]:
            uniforms[i] = torch.rand((), device=logits.device, generator=generator)
    cdf = processed.exp().cumsum(dim=-1)
    targets = (uniforms * cdf[:, -1]).unsqueeze(1)
    tokens = torch.searchsorted(cdf, targets, right=True).squeeze(1).clamp_(max=vocab - 1)
    greedy_index = torch.tensor([i for i, g in enumerate(greedy) if g], device=logits.device) if any(greedy) else None
    if greedy_index is not None:
        tokens[greedy_index] = logits.index_select(0, greedy_index).argmax(dim=-1)
    source = raw if logprobs_mode == "raw" else processed
    logprobs = source.gather(1, tokens[:, None]).squeeze(1)
    if logprobs_mode == "processed" and greedy_index is not None:
        logprobs[greedy_index] = 0.0
    top: list[list[tuple[int, float]]] | None = None
    kmax = max((p.top_logprobs for p in params), default=0)
    if kmax > 0:
        values, indices = source.topk(kmax, dim=-1)
        values_l, indices_l = values.tolist(), indices.tolist()
        top = [
            list(zip(indices_l[i][: p.top_logprobs], values_l[i][: p.top_logprobs], strict=True))
            for i, p in enumerate(params)
        ]
    return tokens, logprobs, top


def find_stop(text: str, stops: Sequence[str], old_len: int) -> tuple[int, str] | None:
    """The earliest stop string in ``text`` that ends after ``old_len``: ``(index, stop)``, or ``None``."""
    best: tuple[int, str] | None = None
    for stop in stops:
        pos = text.find(stop, max(0, old_len - len(stop) + 1))
        if pos >= 0 and (best is None or pos < best[0]):
            best = (pos, stop)
    return best


def held_back(text: str, stops: Sequence[str]) -> int:
    """Characters at the end of ``text`` that could start a stop string (not streamed yet)."""
    held = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), held, -1):
            if text.endswith(stop[:k]):
                held = k
                break
    return held


# -- KV cache surgery (transformers DynamicCache: layers[i].keys/values [batch, heads, seq, dim]) --
