"""The per-rollout policy loss: parity with verl's compute_policy_loss_vanilla."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from agentbolt.lightningrl import row_weights
from agentbolt_verl import advantage as adv
from agentbolt_verl import losses

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


def inputs(rows_per_rollout=(1, 1, 1, 1, 1), width=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    b = sum(rows_per_rollout)
    rollout_ids = [f"r{j}" for j, n in enumerate(rows_per_rollout) for _ in range(n)]
    lengths = torch.randint(2, width + 1, (b,), generator=g)
    mask = (torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)).long()
    mask[0, 1] = 0  # an observation token inside a merged sequence
    old = -torch.rand(b, width, generator=g) * 2
    new = (old + 0.3 * torch.randn(b, width, generator=g)).requires_grad_(True)  # some ratios clip
    per_rollout_adv = torch.randn(len(rows_per_rollout), generator=g)
    index = {r: j for j, r in enumerate(dict.fromkeys(rollout_ids))}
    advantages = torch.stack([per_rollout_adv[index[r]] * mask[i] for i, r in enumerate(rollout_ids)]).float()
    return old, new, advantages, mask, rollout_ids


def weighted(advantages, mask, rollout_ids):
    return advantages * adv.rollout_weights(mask, rollout_ids).float().unsqueeze(-1)


def test_registered_under_its_name() -> None:
    assert core_algos.get_policy_loss_fn(losses.LOSS_MODE) is losses.compute_policy_loss_rollout_mean
    assert losses.register_losses() == [losses.LOSS_MODE]


def test_equals_vanilla_seq_mean_token_mean_with_one_row_per_rollout() -> None:
    old, new, a, mask, rids = inputs()
    ours, ours_metrics = losses.compute_policy_loss_rollout_mean(
        old, new, weighted(a, mask, rids), mask, config=actor_config()
    )
    (g_ours,) = torch.autograd.grad(ours, new)
    ref, ref_metrics = core_algos.compute_policy_loss_vanilla(
        old, new, a, mask, loss_agg_mode="seq-mean-token-mean", config=actor_config()
    )
    (g_ref,) = torch.autograd.grad(ref, new)
    assert abs(ours.item() - ref.item()) <= TOL
    assert (g_ours - g_ref).abs().max().item() <= TOL
    assert ours_metrics == pytest.approx(ref_metrics)  # clipping decisions do not depend on |A|


def test_equals_vanilla_over_concatenated_rollouts() -> None:
    """Rows of one rollout concatenated into one sequence: verl's seq-mean-token-mean over
    rollouts is, by definition, the per-rollout mean."""
    rows = (3, 1, 2, 1)
    old, new, a, mask, rids = inputs(rows_per_rollout=rows, seed=3)
    ours, _ = losses.compute_policy_loss_rollout_mean(old, new, weighted(a, mask, rids), mask, config=actor_config())

    def concat(x):
        out, start = [], 0
        for n in rows:
            sel = mask[start : start + n].bool()
            out.append(x[start : start + n][sel])
            start += n
        return torch.nn.utils.rnn.pad_sequence(out, batch_first=True)

    cmask = concat(torch.ones_like(mask)).long()
    ref, _ = core_algos.compute_policy_loss_vanilla(
        concat(old), concat(new), concat(a), cmask, loss_agg_mode="seq-mean-token-mean", config=actor_config()
    )
    assert abs(ours.item() - ref.item()) <= TOL
    # and core's aggregation (the one torch uses) of the unweighted per-token losses
    pg = torch.maximum(-a * torch.exp(new - old), -a * torch.clamp(torch.exp(new - old), 0.8, 1.28))
    pg = torch.where(a < 0, torch.minimum(-a * 3.0, pg), pg)
    assert abs(ours.item() - core_aggregate(pg, mask, rids, "rollout-mean-token-mean").item()) <= TOL


def test_without_weights_it_is_vanilla_seq_mean_token_sum() -> None:
    old, new, a, mask, _ = inputs(rows_per_rollout=(2, 2))
    ours, _ = losses.compute_policy_loss_rollout_mean(
        old, new, a, mask, loss_agg_mode="token-mean", config=actor_config()
    )
    ref, _ = core_algos.compute_policy_loss_vanilla(
        old, new, a, mask, loss_agg_mode="seq-mean-token-sum", config=actor_config()
    )
    assert abs(ours.item() - ref.item()) <= TOL


def test_uses_verls_global_batch_normalization() -> None:
    """As in verl's ppo_loss: the summed row losses are divided by the mini-batch's row count
    (global_batch_size) and scaled by dp_size."""
    old, new, a, mask, rids = inputs(rows_per_rollout=(2, 1, 1))
    w = weighted(a, mask, rids)
    ours, _ = losses.compute_policy_loss_rollout_mean(
        old, new, w, mask, config=actor_config(dp_size=2, global_batch_size=8, batch_num_tokens=100)
    )
    local, _ = losses.compute_policy_loss_rollout_mean(old, new, w, mask, config=actor_config())
    assert ours.item() == pytest.approx(local.item() * 4 / 8 * 2, abs=TOL)  # 4 local rows


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
