"""Batches of the policy update: transitions checked and prepared, split into mini- and micro-batches.

Pure Python (no torch): :func:`prepare_items` validates each of LightningRL's
:class:`~agentbolt.lightningrl.TrainingRow` s (or a bare :class:`~agentbolt.types.Transition`:
logprob and mask lengths, context length) into a :class:`PreparedTransition`;
:func:`mini_batches` splits them by rollout into the optimizer steps of an epoch;
:func:`assign_token_weights` gives a mini-batch's tokens their loss weights (core's
:func:`~agentbolt.lightningrl.token_loss_weights`); :func:`micro_batches` packs a mini-batch into
forward/backward passes of at most ``micro_batch_tokens`` padded tokens, keeping the samples of
one prompt (a GRPO group) together so that :mod:`agentbolt_torch.update.forward` can run their
prompt once.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from agentbolt.errors import UserError
from agentbolt.lightningrl import RolloutCorrection, TrainingRow, rollout_correction, token_loss_weights
from agentbolt.types import Transition

__all__ = [
    "PreparedTransition",
    "apply_correction",
    "assign_token_weights",
    "micro_batches",
    "mini_batches",
    "prepare_items",
]


@dataclass
class PreparedTransition:
    """One row, prepared. The update sets ``token_weights`` per mini-batch, ``recomputed`` (the
    proximal logprobs) when needed, and with off-policy correction ``is_weights`` and a
    rejection-masked ``mask``."""

    index: int
    rollout: str
    prompt: list[int]
    response: list[int]
    mask: list[float]
    advantage: float
    old: list[float] | None
    """Behaviour logprobs (recorded at sampling)."""
    token_weights: list[float] = field(default_factory=list)
    recomputed: list[float] | None = None
    is_weights: list[float] | None = None
    n_tokens: int = field(init=False)
    prompt_key: tuple[int, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.n_tokens = int(sum(1 for m in self.mask if m > 0))
        self.prompt_key = tuple(self.prompt)

    def set_mask(self, mask: Sequence[int | float]) -> None:
        """Replace the mask (rejection) and recount the trained tokens."""
        self.mask = [float(m) for m in mask]
        self.n_tokens = int(sum(1 for m in self.mask if m > 0))


def apply_correction(
    items: list[PreparedTransition], correction: RolloutCorrection
) -> tuple[list[PreparedTransition], dict[str, float]]:
    """Core's off-policy correction on a whole batch: IS weights and rejection masks from the
    behaviour (``old``, recorded at sampling) and proximal (``recomputed``) logprobs. Returns the
    items left with a trained token and the correction's statistics."""
    behaviour = [it.old for it in items if it.old is not None]
    if len(behaviour) < len(items):
        raise UserError(
            f"{len(items) - len(behaviour)} rows have no behaviour (sampling) logprobs, which off-policy correction "
            "needs (LightningRL leaves such calls out with reason no_logprobs when rollout_is / rollout_rs is set)"
        )
    proximal = [it.recomputed for it in items if it.recomputed is not None]
    if len(proximal) < len(items):
        raise UserError("off-policy correction needs the proximal (recomputed) logprobs of every row")
    result = rollout_correction(
        behaviour,
        proximal,
        [[1 if m > 0 else 0 for m in it.mask] for it in items],
        correction,
    )
    for it, weights, mask in zip(items, result.weights, result.masks, strict=True):
        it.set_mask(mask)
        it.is_weights = weights
    return [it for it in items if it.n_tokens > 0], result.stats


def assign_token_weights(mini: Sequence[PreparedTransition], loss_aggregation: str) -> None:
    """Set each item's per-token loss weights for one mini-batch (one optimizer step): core's
    :func:`~agentbolt.lightningrl.token_loss_weights` over the mini-batch's rows, with the IS
    weights when the update applies off-policy correction."""
    is_weights = [it.is_weights for it in mini if it.is_weights is not None]
    weights = token_loss_weights(
        [it.rollout for it in mini],
        [it.mask for it in mini],
        loss_aggregation,
        is_weights=is_weights if mini and len(is_weights) == len(mini) else None,
    )
    for it, w in zip(mini, weights, strict=True):
        it.token_weights = w


def prepare_items(
    rows: Sequence[TrainingRow | Transition],
    max_model_len: int,
    *,
    keep_empty: bool = False,
) -> list[PreparedTransition]:
    """The rows (or transitions, for :meth:`~agentbolt_torch.update.updater.PolicyUpdater.compute_logprobs`)
    as :class:`PreparedTransition` s, in order.

    Rows without a trainable token are dropped unless ``keep_empty`` (then an empty response is
    kept too, so the result lines up with ``rows``).

    Raises:
        UserError: no prompt tokens, logprobs or mask of the wrong length, or more tokens than
            ``max_model_len``.
    """
    limit = max_model_len
    items: list[PreparedTransition] = []
    for i, t in enumerate(rows):
        where = f"row {i} (rollout {t.rollout_id}, call {t.index})"
        behaviour = t.behaviour_logprobs if isinstance(t, TrainingRow) else t.response_logprobs
        if not t.response_ids:
            if keep_empty:
                items.append(PreparedTransition(i, t.rollout_id, list(t.prompt_ids), [], [], 0.0, None))
            continue
        if not t.prompt_ids:
            raise UserError(f"{where} has no prompt tokens")
        if behaviour is not None and len(behaviour) != len(t.response_ids):
            raise UserError(f"{where}: {len(behaviour)} logprobs for {len(t.response_ids)} response tokens")
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
            old=list(behaviour) if behaviour is not None else None,
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
