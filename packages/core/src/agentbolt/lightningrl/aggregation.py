"""Loss aggregation as weights: how a batch of per-token losses becomes one scalar.

Each function returns one weight per transition: the weight of **each** of its response
tokens that counts (``response_mask`` 1, or every token without a mask). An algorithm then
implements the aggregation, framework-free, as::

    loss = Σ_t  w_t · Σ_k mask_{t,k} · token_loss_{t,k}

(:func:`token_weights` expands the weights to per-token lists, zeros on masked tokens). With
n_t the counted tokens of transition t, the weights satisfy Σ_t w_t · n_t = 1 for any batch
with at least one counted token; transitions with no counted token get weight 0.

- :func:`token_mean`: every token of the batch weighs the same: ``w_t = 1 / Σ n``.
- :func:`seq_mean`: every transition weighs the same, tokens averaged inside it:
  ``w_t = 1 / (T · n_t)`` (T transitions with tokens).
- :func:`per_rollout_mean`: every rollout weighs the same (J rollouts with tokens), so a
  rollout with many calls gets no more weight than one with a single call:
  ``within="token"``: ``w_t = 1 / (J · N_j)`` (N_j tokens of rollout j: a token mean inside
  the rollout); ``within="seq"``: ``w_t = 1 / (J · T_j · n_t)`` (T_j transitions of rollout j:
  a mean of sequence means).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

from ..errors import UserError
from ..types import Transition

__all__ = [
    "LOSS_AGGREGATIONS",
    "loss_weights",
    "per_rollout_mean",
    "seq_mean",
    "token_count",
    "token_mean",
    "token_weights",
]


def token_count(t: Transition) -> int:
    """Response tokens of ``t`` that count in the loss (mask 1)."""
    return sum(t.response_mask) if t.response_mask is not None else len(t.response_ids)


def token_mean(transitions: Sequence[Transition]) -> list[float]:
    """Weights of a mean over every counted token of the batch."""
    counts = [token_count(t) for t in transitions]
    total = sum(counts)
    return [1.0 / total if n and total else 0.0 for n in counts]


def seq_mean(transitions: Sequence[Transition]) -> list[float]:
    """Weights of a mean over transitions of each transition's token mean."""
    counts = [token_count(t) for t in transitions]
    n_seq = sum(1 for n in counts if n)
    return [1.0 / (n_seq * n) if n else 0.0 for n in counts]


def per_rollout_mean(transitions: Sequence[Transition], *, within: Literal["token", "seq"] = "token") -> list[float]:
    """Weights of a mean over rollouts of each rollout's mean loss (``within`` its tokens or
    its sequences); see the module docstring."""
    if within not in ("token", "seq"):
        raise UserError(f"within must be 'token' or 'seq', got {within!r}")
    counts = [token_count(t) for t in transitions]
    tokens: dict[str, int] = {}
    seqs: dict[str, int] = {}
    for t, n in zip(transitions, counts, strict=True):
        if n:
            tokens[t.rollout_id] = tokens.get(t.rollout_id, 0) + n
            seqs[t.rollout_id] = seqs.get(t.rollout_id, 0) + 1
    n_rollouts = len(tokens)
    out = []
    for t, n in zip(transitions, counts, strict=True):
        if not n:
            out.append(0.0)
        elif within == "token":
            out.append(1.0 / (n_rollouts * tokens[t.rollout_id]))
        else:
            out.append(1.0 / (n_rollouts * seqs[t.rollout_id] * n))
    return out


LOSS_AGGREGATIONS: dict[str, Callable[[Sequence[Transition]], list[float]]] = {
    "per_rollout_mean": per_rollout_mean,
    "token_mean": token_mean,
    "seq_mean": seq_mean,
}
"""The aggregations by name."""


def loss_weights(transitions: Sequence[Transition], mode: str = "per_rollout_mean") -> list[float]:
    """Weights of the aggregation named ``mode`` (``per_rollout_mean``, ``token_mean``, ``seq_mean``)."""
    try:
        fn = LOSS_AGGREGATIONS[mode]
    except KeyError:
        raise UserError(
            f"unknown loss aggregation {mode!r}; valid names: {', '.join(sorted(LOSS_AGGREGATIONS))}"
        ) from None
    return fn(transitions)


def token_weights(transitions: Sequence[Transition], weights: Sequence[float]) -> list[list[float]]:
    """Per-token weights: ``weights[t]`` on each counted response token of ``t``, 0.0 on masked ones."""
    if len(weights) != len(transitions):
        raise UserError(f"{len(weights)} weights for {len(transitions)} transitions")
    out = []
    for t, w in zip(transitions, weights, strict=True):
        mask = t.response_mask if t.response_mask is not None else [1] * len(t.response_ids)
        out.append([w if m else 0.0 for m in mask])
    return out
