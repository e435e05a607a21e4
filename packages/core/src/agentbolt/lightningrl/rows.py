"""Training rows: what LightningRL hands a backend, and the per-token loss weights of a batch.

A :class:`TrainingRow` is one transition (an LLM call, or consecutive calls merged into one
masked sequence) with everything a backend needs to pack tensors and weigh its loss: ids,
response mask, behaviour (sampling) logprobs, policy version, group, agent, and the two numbers
LightningRL decides: the row's **advantage** and its **loss weight** (the weight of each of its
trained tokens, :func:`~agentbolt.lightningrl.aggregation.row_weights` over the rows of the
batch). A backend computes, per response token ``k`` of row ``r``::

    loss = Σ_r Σ_k  loss_weight_r · mask_{r,k} · pg_loss(A_r, ratio_{r,k})      (PPO-clip pg_loss)

and never re-derives credit, grouping, the missing-reward rule or the aggregation.

With off-policy correction (:mod:`.correction`) or with several optimizer steps per batch, the
per-token weights are recomputed from the same rows by :func:`token_loss_weights`: the rows of a
mini-batch, their (possibly rejection-masked) masks and the IS weights. agentbolt-torch calls it
per mini-batch, agentbolt-verl once per step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..errors import UserError
from ..types import Transition
from .aggregation import DEFAULT_LOSS_AGGREGATION, row_weights, token_count

__all__ = ["TrainingRow", "token_loss_weights", "training_rows"]


@dataclass(frozen=True)
class TrainingRow:
    """One row of a training batch (see the module docstring)."""

    rollout_id: str
    """The rollout (rows of one rollout weigh together under ``rollout-mean-token-mean``)."""
    group_id: str | None
    """The advantage group (rollouts of one task in one step)."""
    agent_name: str | None
    """The agent that made the call(s)."""
    index: int
    """Call index within the rollout (the first call of a merged row)."""
    prompt_ids: list[int]
    """Prompt token ids exactly as the policy saw them."""
    response_ids: list[int]
    """Response token ids (merged rows: responses and the observations between them)."""
    response_mask: list[int]
    """1 on tokens the policy generated and that are trained, 0 on observations."""
    behaviour_logprobs: list[float] | None
    """Logprob of each response token under the policy that sampled it (0.0 on observations);
    ``None`` when the backend reported none."""
    policy_version: int | None
    """The policy version that sampled the response."""
    reward: float | None
    """The row's credit (credit assigner); ``None`` only for rows built from transitions that an
    algorithm gave advantages without rewards."""
    advantage: float
    """The row's advantage (advantage estimator), the same for each of its trained tokens."""
    loss_weight: float
    """Weight of each trained token in the batch loss (``loss_aggregation`` over the batch's rows);
    0.0 for a row without trained tokens."""
    transition: Transition = field(repr=False, compare=False)
    """The transition the row came from (with ``reward`` and ``advantage`` set)."""

    @property
    def n_tokens(self) -> int:
        """Trained tokens (mask 1)."""
        return sum(self.response_mask)

    def token_advantages(self) -> list[float]:
        """The advantage on each trained token, 0.0 elsewhere."""
        return [self.advantage if m else 0.0 for m in self.response_mask]

    def token_loss_weights(self) -> list[float]:
        """The loss weight on each trained token, 0.0 elsewhere."""
        return [self.loss_weight if m else 0.0 for m in self.response_mask]


def training_rows(
    transitions: Sequence[Transition], loss_aggregation: str = DEFAULT_LOSS_AGGREGATION
) -> list[TrainingRow]:
    """Rows of transitions that carry an advantage, weighed with ``loss_aggregation``.

    Raises:
        UserError: a transition has no advantage (run the advantage estimator first:
            :meth:`~agentbolt.lightningrl.LightningRL.process`), or malformed lengths.
    """
    weights = row_weights([t.rollout_id for t in transitions], [token_count(t) for t in transitions], loss_aggregation)
    rows = []
    for t, w in zip(transitions, weights, strict=True):
        where = f"transition {t.index} of rollout {t.rollout_id!r}"
        if t.advantage is None:
            raise UserError(f"{where} has no advantage: compute advantages (LightningRL) before training")
        mask = [1 if m else 0 for m in t.response_mask] if t.response_mask is not None else [1] * len(t.response_ids)
        if len(mask) != len(t.response_ids):
            raise UserError(f"{where}: response_mask has {len(mask)} entries for {len(t.response_ids)} tokens")
        if t.response_logprobs is not None and len(t.response_logprobs) != len(t.response_ids):
            raise UserError(f"{where}: {len(t.response_logprobs)} logprobs for {len(t.response_ids)} response tokens")
        rows.append(
            TrainingRow(
                rollout_id=t.rollout_id,
                group_id=t.group_id,
                agent_name=t.agent_name,
                index=t.index,
                prompt_ids=list(t.prompt_ids),
                response_ids=list(t.response_ids),
                response_mask=mask,
                behaviour_logprobs=None if t.response_logprobs is None else list(t.response_logprobs),
                policy_version=t.policy_version,
                reward=None if t.reward is None else float(t.reward),
                advantage=float(t.advantage),
                loss_weight=w,
                transition=t,
            )
        )
    return rows


def token_loss_weights(
    rollout_ids: Sequence[str],
    masks: Sequence[Sequence[int | float]],
    loss_aggregation: str = DEFAULT_LOSS_AGGREGATION,
    *,
    is_weights: Sequence[Sequence[float]] | None = None,
) -> list[list[float]]:
    """Per-token loss weights of a set of rows (a batch, or one mini-batch of it).

    ``row_weights(rollout_ids, trained tokens per row, loss_aggregation)`` on each trained
    token, times the token's importance-sampling weight when ``is_weights`` are given
    (:func:`~agentbolt.lightningrl.correction.rollout_correction`; pass the masks it returned,
    so rejected tokens neither weigh nor count).
    """
    if len(rollout_ids) != len(masks) or (is_weights is not None and len(is_weights) != len(masks)):
        raise UserError(
            f"{len(rollout_ids)} rollout ids, {len(masks)} masks"
            + (f", {len(is_weights)} IS weight rows" if is_weights is not None else "")
        )
    counts = [sum(1 for m in mask if m) for mask in masks]
    weights = row_weights(list(rollout_ids), counts, loss_aggregation)
    out = []
    for i, (mask, w) in enumerate(zip(masks, weights, strict=True)):
        if is_weights is None:
            out.append([w if m else 0.0 for m in mask])
        else:
            if len(is_weights[i]) != len(mask):
                raise UserError(f"row {i}: {len(is_weights[i])} IS weights for {len(mask)} mask entries")
            out.append([w * s if m else 0.0 for m, s in zip(mask, is_weights[i], strict=True)])
    return out
