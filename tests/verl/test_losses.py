"""The one registered policy loss: verl's clipped PPO objective weighted by LightningRL's loss weights."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from agentbolt.errors import UserError
from agentbolt.lightningrl import row_weights
from agentbolt_verl import losses, registry

core_algos = losses.core_algos
TOL = 1e-6


def actor_config(**global_batch_info):
    """The fields of verl's ActorConfig that the vanilla loss reads."""
    return OmegaConf.create(
        {
            "clip_ratio": 0.2,
            "clip_ratio_low": 0.2,
            "clip_ratio_high": 0.28,
            "clip_ratio_c": 3.0,
            "global_batch_info": global_batch_info,
        }
    )


def inputs(rows=5, width=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, width + 1, (rows,), generator=g)
    mask = (torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)).long()
    mask[0, 1] = 0  # an observation token inside a merged sequence
    old = -torch.rand(rows, width, generator=g) * 2
    new = (old + 0.3 * torch.randn(rows, width, generator=g)).requires_grad_(True)  # some ratios clip
    advantages = torch.randn(rows, 1, generator=g) * mask
    return old, new, advantages, mask


def test_registered_under_its_name_with_the_advantage_sentinel() -> None:
    assert core_algos.get_policy_loss_fn(losses.LOSS_MODE) is losses.compute_policy_loss_agentbolt
    assert registry.register_all() == {"adv_estimators": ["agentbolt"], "policy_losses": ["agentbolt"]}
    with pytest.raises(UserError, match="advantages are LightningRL's"):
        core_algos.get_adv_estimator_fn("agentbolt")(token_level_rewards=None, response_mask=None)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_with_cores_weights_it_is_verls_vanilla_loss_for_verls_modes(mode) -> None:
    """B · row_weights in the weight column + seq-mean-token-sum over B rows = verl's own aggregation."""
    old, new, a, mask = inputs(seed=3)
    rows = mask.shape[0]
    weights = torch.tensor(row_weights([str(i) for i in range(rows)], mask.sum(-1).tolist(), mode), dtype=torch.float32)
    column = (weights * rows).unsqueeze(-1) * mask
    ours, ours_metrics = losses.compute_policy_loss_agentbolt(
        old, new, a, mask, config=actor_config(), rollout_is_weights=column
    )
    (g_ours,) = torch.autograd.grad(ours, new)
    ref, ref_metrics = core_algos.compute_policy_loss_vanilla(
        old, new, a, mask, loss_agg_mode=mode, config=actor_config()
    )
    (g_ref,) = torch.autograd.grad(ref, new)
    assert abs(ours.item() - ref.item()) <= TOL
    assert (g_ours - g_ref).abs().max().item() <= TOL
    assert ours_metrics == pytest.approx(ref_metrics)


def test_uses_verls_global_batch_normalization() -> None:
    """As in verl's ppo_loss: the summed row losses are divided by the mini-batch's row count
    (global_batch_size) and scaled by dp_size."""
    old, new, a, mask = inputs(rows=4)
    column = torch.rand(4, 1) * mask
    ours, _ = losses.compute_policy_loss_agentbolt(
        old,
        new,
        a,
        mask,
        config=actor_config(dp_size=2, global_batch_size=8, batch_num_tokens=100),
        rollout_is_weights=column,
    )
    local, _ = losses.compute_policy_loss_agentbolt(old, new, a, mask, config=actor_config(), rollout_is_weights=column)
    assert ours.item() == pytest.approx(local.item() * 4 / 8 * 2, abs=TOL)  # 4 local rows


def test_without_the_weight_column_it_refuses_to_run() -> None:
    old, new, a, mask = inputs()
    with pytest.raises(UserError, match="rollout_is_weights"):
        losses.compute_policy_loss_agentbolt(old, new, a, mask, config=actor_config())


def core_aggregate(loss_mat, mask, rollout_ids, mode):
    """Σ_r w_r Σ_k mask·loss with core's row weights (agentbolt.lightningrl.row_weights)."""
    w = row_weights(rollout_ids, mask.sum(-1).tolist(), mode)
    return ((loss_mat * mask).sum(-1) * torch.tensor(w, dtype=loss_mat.dtype)).sum()


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_core_aggregation_equals_verls_agg_loss(mode) -> None:
    """Core's weights for verl's modes give exactly verl's own agg_loss (empty rows included)."""
    g = torch.Generator().manual_seed(7)
    loss = torch.randn(5, 7, generator=g, dtype=torch.float64)
    mask = (torch.rand(5, 7, generator=g) > 0.4).long()
    mask[3] = 0  # a row without a trained token
    rids = ["a", "a", "b", "c", "c"]
    ref = core_algos.agg_loss(loss, mask, mode)
    assert abs(core_aggregate(loss, mask, rids, mode).item() - ref.item()) <= 1e-12


def test_core_rollout_mean_is_verls_seq_mean_over_concatenated_rollouts() -> None:
    g = torch.Generator().manual_seed(11)
    loss = torch.randn(4, 6, generator=g, dtype=torch.float64)
    mask = (torch.rand(4, 6, generator=g) > 0.3).long()
    rids = ["a", "a", "a", "b"]
    concat = torch.zeros(2, 18, dtype=torch.float64)
    cmask = torch.zeros(2, 18, dtype=torch.long)
    concat[0] = loss[:3].reshape(-1)
    cmask[0] = mask[:3].reshape(-1)
    concat[1, :6], cmask[1, :6] = loss[3], mask[3]
    ref = core_algos.agg_loss(concat, cmask, "seq-mean-token-mean")
    assert abs(core_aggregate(loss, mask, rids, "rollout-mean-token-mean").item() - ref.item()) <= 1e-12


def test_core_rollout_mean_leaves_empty_rollouts_out() -> None:
    loss = torch.tensor([[1.0, 3.0, 0.0], [5.0, 0.0, 0.0], [2.0, 2.0, 2.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    # rollout a: tokens 1, 3, 5 → 3; rollout b has no token and is left out
    assert core_aggregate(loss, mask, ["a", "a", "b"], "rollout-mean-token-mean").item() == pytest.approx(3.0)
