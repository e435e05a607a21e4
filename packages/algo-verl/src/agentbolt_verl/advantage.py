"""Layer 2: rollout-level advantages, registered in verl's advantage-estimator registry.

verl's built-in GRPO groups **rows** by ``uid``: when a rollout is split into one row per LLM
call, a rollout with many calls puts many copies of its reward into the group, which shifts
the group mean and standard deviation towards long rollouts. Here each rollout counts once:

1. one score per rollout: the reward summed over its **last** row (highest
   ``transition_index``), i.e. the episode's final reward under LightningRL's ``final`` credit;
2. verl's own estimator (``grpo``, ``rloo``, ``reinforce_plus_plus_baseline``, ...) on those
   scores, grouped by ``uid`` (the rollout's ``group_id``);
3. the rollout's scalar broadcast onto every trained token of every row of the rollout.

With one row per rollout this is exactly verl's estimator (the tests check the difference is
at most 1e-6). Options: ``singleton_groups="zero"`` gives 0 to a rollout alone in its group
(verl gives it its raw reward); ``aggregation="rollout-mean-token-mean"`` (a
:class:`~agentbolt.lightningrl.LightningRLConfig` ``loss_aggregation``) folds the per-rollout
loss weights into the advantages for :mod:`agentbolt_verl.losses` (see :func:`rollout_weights`).

verl calls a registered estimator as ``fn(token_level_rewards=, response_mask=, config=,
index=uid)`` (``verl/trainer/ppo/ray_trainer.py`` ``compute_advantage``): it passes no rollout
membership. Callers therefore give it either directly (``rollout_index=``) or for a scope with
:func:`rollout_membership`, which the binding's trainer opens around verl's advantage step.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from agentbolt.errors import SchemaError, UserError
from agentbolt.lightningrl import LossAggregation, check_loss_aggregation, row_weights

from ._verl import import_verl

core_algos = import_verl("verl.trainer.ppo.core_algos")

__all__ = [
    "BASE_ESTIMATORS",
    "REGISTERED_ESTIMATORS",
    "RolloutAdvantageStats",
    "RolloutMembership",
    "compute_rollout_advantage",
    "membership_from_verl_keys",
    "register_estimators",
    "rollout_membership",
    "rollout_weights",
]

BASE_ESTIMATORS = ("grpo", "grpo_vectorized", "rloo", "rloo_vectorized", "reinforce_plus_plus_baseline")
"""verl estimators that only read one outcome score per row, so they can run per rollout."""

REGISTERED_ESTIMATORS = {
    "agentbolt_rollout_grpo": "grpo",
    "agentbolt_rollout_rloo": "rloo",
    "agentbolt_rollout_reinforce_plus_plus_baseline": "reinforce_plus_plus_baseline",
}
"""Names registered in verl's ``ADV_ESTIMATOR_REGISTRY`` → the verl estimator they wrap.
Select one with ``algorithm.adv_estimator=<name>``."""

_FOLDED = "rollout-mean-token-mean"
"""The aggregation whose weights are folded into the advantages (verl's loss cannot see rollouts)."""
Singletons = Literal["raw", "zero"]


@dataclass
class RolloutAdvantageStats:
    """Counts from one rollout-level advantage computation."""

    rows: int = 0
    """Rows in the batch."""
    rollouts: int = 0
    """Distinct rollouts."""
    groups: int = 0
    """Distinct groups (``uid``)."""
    singleton_groups: int = 0
    """Groups with a single rollout (advantage 0 with ``singleton_groups="zero"``)."""
    zero_variance_groups: int = 0
    """Groups of two or more rollouts whose scores are all equal (advantage 0)."""
    multi_row_rollouts: int = 0
    """Rollouts split over more than one row."""
    max_rows_per_rollout: int = 0
    """Most rows of one rollout."""

    def as_metrics(self, prefix: str = "agentbolt/advantage/") -> dict[str, float]:
        """The counts as a flat metrics dict."""
        return {f"{prefix}{k}": float(v) for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class RolloutMembership:
    """Which rollout each row of the batch verl is about to pass to an estimator belongs to."""

    rollout_ids: tuple[str, ...]
    """Rollout of each row, in batch order."""
    turn_index: tuple[int, ...] | None = None
    """Call index of each row within its rollout (the highest one carries the final score)."""
    aggregation: LossAggregation = "token-mean"
    """``rollout-mean-token-mean``: fold :func:`rollout_weights` into the advantages (other
    modes are verl's own ``loss_agg_mode``: advantages stay plain)."""
    singleton_groups: Singletons = "raw"
    """``zero``: a rollout alone in its group gets advantage 0."""
    stats: dict[str, float] = field(default_factory=dict)
    """Filled by the estimator with :meth:`RolloutAdvantageStats.as_metrics`."""


_MEMBERSHIP: ContextVar[RolloutMembership | None] = ContextVar("agentbolt_rollout_membership", default=None)


@contextlib.contextmanager
def rollout_membership(
    rollout_ids: Sequence[str],
    turn_index: Sequence[int] | None = None,
    *,
    aggregation: LossAggregation = "token-mean",
    singleton_groups: Singletons = "raw",
) -> Iterator[RolloutMembership]:
    """Make row → rollout membership visible to the registered estimators for a scope."""
    check_loss_aggregation(aggregation)
    _check_choice("singleton_groups", singleton_groups, ("raw", "zero"))
    membership = RolloutMembership(
        rollout_ids=tuple(str(r) for r in rollout_ids),
        turn_index=None if turn_index is None else tuple(int(i) for i in turn_index),
        aggregation=aggregation,
        singleton_groups=singleton_groups,
    )
    token = _MEMBERSHIP.set(membership)
    try:
        yield membership
    finally:
        _MEMBERSHIP.reset(token)


def membership_from_verl_keys(keys: Sequence[str]) -> tuple[list[str], list[int]]:
    """Rollout ids and call indices from verl V1 TransferQueue keys ``{uid}_{session}_{index}``.

    The format is the one ``compute_advantage_for_multi_trajectories`` parses
    (``verl/trainer/ppo/v1/utils.py``): a rollout is a ``{uid}_{session}`` session.
    """
    rollout_ids, indices = [], []
    for key in keys:
        parts = str(key).rsplit("_", 2)
        if len(parts) != 3 or not parts[2].lstrip("-").isdigit():
            raise SchemaError(f"verl batch key {key!r} is not '{{uid}}_{{session_id}}_{{index}}'")
        rollout_ids.append(f"{parts[0]}_{parts[1]}")
        indices.append(int(parts[2]))
    return rollout_ids, indices


def rollout_weights(response_mask: torch.Tensor, rollout_ids: Sequence[str]) -> torch.Tensor:
    """Per-row loss weights of a per-rollout mean, scaled for verl's ``seq-mean-token-sum``.

    With ``B`` rows, ``J`` rollouts that have trained tokens and ``N_j`` trained tokens in
    rollout ``j``, a row of rollout ``j`` gets ``B / (J · N_j)`` (0 when ``N_j`` is 0). verl's
    ``seq-mean-token-sum`` divides the summed token losses by the rows of the mini-batch (``B``
    for one mini-batch), so the loss becomes ``(1/J) Σ_j (1/N_j) Σ_{t∈j} loss_t``: each rollout
    weighs the same however many calls (rows) and tokens it has. A per-row positive factor
    can be folded into the advantages because the clipped PPO objective is positively
    homogeneous in the advantage.
    """
    b = response_mask.shape[0]
    if len(rollout_ids) != b:
        raise SchemaError(f"{len(rollout_ids)} rollout ids for {b} rows")
    tokens = response_mask.to(torch.float64).sum(dim=-1).tolist()
    weights = row_weights([str(r) for r in rollout_ids], tokens, _FOLDED)  # core's one aggregation primitive
    return torch.tensor(weights, dtype=torch.float64) * b


def compute_rollout_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any],
    rollout_ids: Sequence[str],
    turn_index: Sequence[int] | None = None,
    *,
    estimator: str = "grpo",
    norm_adv_by_std_in_grpo: bool = True,
    epsilon: float = 1e-6,
    singleton_groups: Singletons = "raw",
    aggregation: LossAggregation = "token-mean",
    config: Any = None,
) -> tuple[torch.Tensor, torch.Tensor, RolloutAdvantageStats]:
    """One advantage per rollout with verl's ``estimator``, broadcast to the rollout's rows.

    Args:
        token_level_rewards: (B, R) rewards (a row's reward on its last token).
        response_mask: (B, R) trained tokens.
        index: group of each row (verl's ``uid``); constant within a rollout.
        rollout_ids: rollout of each row.
        turn_index: call index of each row; the highest of a rollout gives its score
            (default: its last row in batch order).
        estimator: a verl estimator of :data:`BASE_ESTIMATORS`.
        norm_adv_by_std_in_grpo: GRPO divides by the group std (``False``: Dr.GRPO).
        epsilon: verl's std epsilon.
        singleton_groups: ``raw`` (verl) or ``zero``.
        aggregation: ``rollout-mean-token-mean``: advantages times :func:`rollout_weights`;
            any other :data:`~agentbolt.lightningrl.LOSS_AGGREGATIONS` mode: plain advantages.
        config: verl's ``AlgoConfig`` (passed through to the estimator).

    Returns:
        ``(advantages, returns, stats)``; ``returns`` never carry the loss weights.
    """
    _check_choice("estimator", estimator, BASE_ESTIMATORS)
    _check_choice("singleton_groups", singleton_groups, ("raw", "zero"))
    check_loss_aggregation(aggregation)
    b = token_level_rewards.shape[0]
    if tuple(response_mask.shape) != tuple(token_level_rewards.shape):
        raise SchemaError(
            f"response_mask {tuple(response_mask.shape)} and token_level_rewards "
            f"{tuple(token_level_rewards.shape)} differ in shape"
        )
    if len(index) != b or len(rollout_ids) != b or (turn_index is not None and len(turn_index) != b):
        raise SchemaError(f"index, rollout_ids and turn_index must have one entry per row ({b})")

    rows_of: dict[str, list[int]] = {}
    for row, rid in enumerate(rollout_ids):
        rows_of.setdefault(str(rid), []).append(row)
    order = list(rows_of)
    representative = []
    for rid in order:
        rows = rows_of[rid]
        uids = {index[r] for r in rows}
        if len(uids) > 1:
            raise SchemaError(f"rollout {rid!r} has rows in several groups {sorted(map(str, uids))}")
        if turn_index is None:
            representative.append(rows[-1])
        else:
            representative.append(max(rows, key=lambda r: (int(turn_index[r]), r)))

    scores = token_level_rewards.sum(dim=-1)
    rep_scores = scores[representative].unsqueeze(-1)
    rep_index = np.empty(len(order), dtype=object)
    rep_index[:] = [index[r] for r in representative]
    fn = core_algos.get_adv_estimator_fn(estimator)
    kwargs: dict[str, Any] = {
        "token_level_rewards": rep_scores,
        "response_mask": torch.ones_like(rep_scores),
        "index": rep_index,
        "epsilon": epsilon,
        "norm_adv_by_std_in_grpo": norm_adv_by_std_in_grpo,
        "config": config,
    }
    params = inspect.signature(fn).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        kwargs = {k: v for k, v in kwargs.items() if k in params}
    elif "norm_adv_by_std_in_grpo" not in params:
        kwargs.pop("norm_adv_by_std_in_grpo")
    rep_adv, rep_ret = fn(**kwargs)
    adv_scalar, ret_scalar = rep_adv[:, 0].clone(), rep_ret[:, 0].clone()

    group_scores: dict[Any, list[float]] = {}
    for k, r in enumerate(representative):
        group_scores.setdefault(index[r], []).append(float(rep_scores[k, 0]))
    stats = RolloutAdvantageStats(
        rows=b,
        rollouts=len(order),
        groups=len(group_scores),
        singleton_groups=sum(1 for s in group_scores.values() if len(s) == 1),
        zero_variance_groups=sum(1 for s in group_scores.values() if len(s) > 1 and len(set(s)) == 1),
        multi_row_rollouts=sum(1 for rows in rows_of.values() if len(rows) > 1),
        max_rows_per_rollout=max((len(rows) for rows in rows_of.values()), default=0),
    )
    if singleton_groups == "zero":
        alone = torch.tensor([len(group_scores[index[r]]) == 1 for r in representative], dtype=torch.bool)
        adv_scalar[alone] = 0.0
        ret_scalar[alone] = 0.0

    position = {rid: k for k, rid in enumerate(order)}
    per_row = torch.tensor([position[str(rid)] for rid in rollout_ids], dtype=torch.long)
    mask = response_mask.to(adv_scalar.dtype)
    advantages = adv_scalar[per_row].unsqueeze(-1) * mask
    returns = ret_scalar[per_row].unsqueeze(-1) * mask
    if aggregation == _FOLDED:
        weights = rollout_weights(response_mask, [str(r) for r in rollout_ids]).to(advantages.dtype)
        advantages = advantages * weights.unsqueeze(-1)
    return advantages, returns, stats


def _registered_estimator(name: str, base: str) -> Any:
    def estimator(
        token_level_rewards: torch.Tensor,
        response_mask: torch.Tensor,
        index: Sequence[Any] | None = None,
        config: Any = None,
        *,
        rollout_index: Sequence[str] | None = None,
        turn_index: Sequence[int] | None = None,
        epsilon: float = 1e-6,
        norm_adv_by_std_in_grpo: bool | None = None,
        aggregation: LossAggregation = "token-mean",
        singleton_groups: Singletons = "raw",
        **_: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if index is None:
            raise UserError(f"advantage estimator {name!r} needs index= (verl passes non_tensor_batch['uid'])")
        membership = _MEMBERSHIP.get()
        if rollout_index is None:
            if membership is None:
                raise UserError(
                    f"advantage estimator {name!r} needs to know which rollout each row belongs to, and "
                    "verl's compute_advantage passes only the group uid. Run verl with "
                    "trainer.v1.trainer_mode=agentbolt_sync (the agentbolt binding), or call it with "
                    "rollout_index= / inside agentbolt_verl.advantage.rollout_membership(...)."
                )
            if len(membership.rollout_ids) != token_level_rewards.shape[0]:
                raise SchemaError(
                    f"rollout membership has {len(membership.rollout_ids)} rows, the batch "
                    f"{token_level_rewards.shape[0]}"
                )
            rollout_index, turn_index = membership.rollout_ids, membership.turn_index
            aggregation, singleton_groups = membership.aggregation, membership.singleton_groups
        if norm_adv_by_std_in_grpo is None:
            norm_adv_by_std_in_grpo = bool(_config_get(config, "norm_adv_by_std_in_grpo", True))
        advantages, returns, stats = compute_rollout_advantage(
            token_level_rewards,
            response_mask,
            index,
            rollout_index,
            turn_index,
            estimator=base,
            norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
            epsilon=epsilon,
            singleton_groups=singleton_groups,
            aggregation=aggregation,
            config=config,
        )
        if membership is not None:
            membership.stats.update(stats.as_metrics())
        return advantages, returns

    estimator.__name__ = estimator.__qualname__ = name
    estimator.__doc__ = f"Rollout-level ``{base}`` (agentbolt): see :func:`compute_rollout_advantage`."
    return estimator


ESTIMATORS = {name: _registered_estimator(name, base) for name, base in REGISTERED_ESTIMATORS.items()}
"""The estimator functions, by registered name."""


def register_estimators() -> list[str]:
    """Register :data:`ESTIMATORS` in verl's ``ADV_ESTIMATOR_REGISTRY`` (idempotent).

    Raises :class:`~agentbolt.errors.UserError` if another package registered one of the names.
    """
    registry = core_algos.ADV_ESTIMATOR_REGISTRY
    for name, fn in ESTIMATORS.items():
        existing = registry.get(name)
        if existing is fn:
            continue
        if existing is not None:
            if getattr(existing, "__module__", None) != __name__:
                raise UserError(f"verl advantage estimator {name!r} is already registered by {existing.__module__}")
            del registry[name]  # this module was imported again (reload): replace our own entry
        core_algos.register_adv_est(name)(fn)
    return list(ESTIMATORS)


def _config_get(config: Any, key: str, default: Any) -> Any:
    if config is None:
        return default
    getter = getattr(config, "get", None)
    if callable(getter):
        return getter(key, default)
    return getattr(config, key, default)


def _check_choice(name: str, value: Any, valid: Sequence[str]) -> None:
    if value not in valid:
        raise UserError(f"{name} must be one of {', '.join(valid)}; got {value!r}")


register_estimators()
