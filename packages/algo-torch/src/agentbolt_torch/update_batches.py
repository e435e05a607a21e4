"""Batches of the policy update: transitions checked and prepared, split into mini- and micro-batches.

Pure Python (no torch): :func:`prepare_items` validates each
:class:`~agentbolt.types.Transition` (advantage, logprob and mask lengths, context length) into
a :class:`PreparedTransition`; :func:`mini_batches` splits them by rollout into the optimizer
steps of an epoch; :func:`micro_batches` packs a mini-batch into forward/backward passes of at
most ``micro_batch_tokens`` padded tokens, keeping the samples of one prompt (a GRPO group)
together so that :mod:`agentbolt_torch.update_forward` can run their prompt once.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from agentbolt.errors import UserError
from agentbolt.types import Transition

__all__ = ["PreparedTransition", "micro_batches", "mini_batches", "prepare_items"]


@dataclass
class PreparedTransition:
    """One transition, prepared (the update sets ``weight`` per mini-batch, ``recomputed`` when needed)."""

    index: int
    rollout: str
    prompt: list[int]
    response: list[int]
    mask: list[float]
    advantage: float
    old: list[float] | None
    weight: float = 0.0
    recomputed: list[float] | None = None
    n_tokens: int = field(init=False)
    prompt_key: tuple[int, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.n_tokens = int(sum(1 for m in self.mask if m > 0))
        self.prompt_key = tuple(self.prompt)


def prepare_items(
    transitions: Sequence[Transition],
    max_model_len: int,
    *,
    require_advantage: bool = True,
    keep_empty: bool = False,
) -> list[PreparedTransition]:
    """The transitions as :class:`PreparedTransition` s, in order.

    Transitions without a trainable token are dropped unless ``keep_empty`` (then an empty
    response is kept too, so the result lines up with ``transitions``).

    Raises:
        UserError: no prompt tokens, no advantage (with ``require_advantage``), logprobs or mask of
            the wrong length, or more tokens than ``max_model_len``.
    """
    limit = max_model_len
    items: list[PreparedTransition] = []
    for i, t in enumerate(transitions):
        where = f"transition {i} (rollout {t.rollout_id}, call {t.index})"
        if not t.response_ids:
            if keep_empty:
                items.append(PreparedTransition(i, t.rollout_id, list(t.prompt_ids), [], [], 0.0, None))
            continue
        if not t.prompt_ids:
            raise UserError(f"{where} has no prompt tokens")
        if require_advantage and t.advantage is None:
            raise UserError(f"{where} has no advantage; compute advantages (LightningRL) before updating")
        if t.response_logprobs is not None and len(t.response_logprobs) != len(t.response_ids):
            raise UserError(f"{where}: {len(t.response_logprobs)} logprobs for {len(t.response_ids)} response tokens")
        mask = [float(m) for m in (t.response_mask or [1] * len(t.response_ids))]
        if len(mask) != len(t.response_ids):
            raise UserError(f"{where}: response_mask has {len(mask)} entries for {len(t.response_ids)} tokens")
        if len(t.prompt_ids) + len(t.response_ids) > limit:
            raise UserError(
                f"{where} has {len(t.prompt_ids) + len(t.response_ids)} tokens, more than the context ({limit})"
            )
        item = PreparedTransition(
            index=i,
            rollout=t.rollout_id,
            prompt=list(t.prompt_ids),
            response=list(t.response_ids),
            mask=mask,
            advantage=float(t.advantage or 0.0),
            old=list(t.response_logprobs) if t.response_logprobs is not None else None,
        )
        if item.n_tokens == 0 and not keep_empty:
            continue
        items.append(item)
    return items


def mini_batches(items: list[PreparedTransition], k: int, rng: random.Random) -> list[list[PreparedTransition]]:
    """``items`` split into ``k`` mini-batches by rollout (rollouts shuffled with ``rng``); empty ones dropped."""
    if k == 1:
        return [items]
    rollouts = sorted({it.rollout for it in items})
    rng.shuffle(rollouts)
    groups = [set(rollouts[j::k]) for j in range(k)]
    batches = [[it for it in items if it.rollout in g] for g in groups]
    return [b for b in batches if b]


def micro_batches(
    items: list[PreparedTransition], budget: int, *, share_prompts: bool
) -> list[list[PreparedTransition]]:
    """Pack items into micro-batches of at most ``budget`` padded tokens.

    Sorted by prompt length, then prompt (so a group's samples are neighbours), then response
    length. The cost of a micro-batch is ``rows x (P + R)``, or with prompt sharing
    ``distinct prompts x P + rows x R``. A sequence over the budget gets a micro-batch of its own.
    """
    sharing = share_prompts
    ordered = sorted(items, key=lambda it: (len(it.prompt), it.prompt_key, len(it.response)))
    batches: list[list[PreparedTransition]] = []
    current: list[PreparedTransition] = []
    prompts: set[tuple[int, ...]] = set()
    max_p = max_r = 0
    for it in ordered:
        p, r = max(max_p, len(it.prompt)), max(max_r, len(it.response))
        if sharing:
            n_prompts = len(prompts) + (it.prompt_key not in prompts)
            cost = n_prompts * p + (len(current) + 1) * r
        else:
            cost = (len(current) + 1) * (p + r)
        if current and cost > budget:
            batches.append(current)
            current, prompts, p, r = [], set(), len(it.prompt), len(it.response)
        current.append(it)
        prompts.add(it.prompt_key)
        max_p, max_r = p, r
    if current:
        batches.append(current)
    return batches
