"""Rollout-level advantages: parity with verl's estimators, registration in verl's registry."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from verl_helpers import tr

from agentbolt.errors import SchemaError, UserError
from agentbolt_verl import advantage as adv
from agentbolt_verl import to_verl
from agentbolt_verl.batch import BatchOptions, build_batch

core_algos = adv.core_algos
TOL = 1e-6
pytestmark = [
    pytest.mark.filterwarnings("ignore:.*engine is not available:UserWarning"),
    pytest.mark.filterwarnings("ignore:Ray state API:DeprecationWarning"),
]


def one_row_per_rollout(seed: int = 0, groups: tuple[int, ...] = (4, 3, 5), width: int = 7):
    """Rows with random lengths and rewards; each row is its own rollout."""
    g = torch.Generator().manual_seed(seed)
    b = sum(groups)
    lengths = torch.randint(1, width + 1, (b,), generator=g)
    mask = (torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)).long()
    rewards = torch.zeros(b, width)
    scores = torch.randint(0, 3, (b,), generator=g).float() + torch.rand(b, generator=g)
    rewards[torch.arange(b), lengths - 1] = scores
    uid = np.array([f"g{k}" for k, n in enumerate(groups) for _ in range(n)], dtype=object)
    return rewards, mask, uid


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("groups", [(4, 3, 5), (2, 1, 3, 1)])
def test_grpo_equals_verl_when_each_rollout_has_one_transition(norm, groups) -> None:
    rewards, mask, uid = one_row_per_rollout(groups=groups)
    ours = core_algos.get_adv_estimator_fn("agentbolt_rollout_grpo")
    a, r = ours(
        rewards, mask, index=uid, rollout_index=[f"r{i}" for i in range(len(uid))], norm_adv_by_std_in_grpo=norm
    )
    va, vr = core_algos.compute_grpo_outcome_advantage(rewards, mask, index=uid, norm_adv_by_std_in_grpo=norm)
    assert (a - va).abs().max().item() <= TOL
    assert (r - vr).abs().max().item() <= TOL


def test_rloo_equals_verl_when_each_rollout_has_one_transition() -> None:
    rewards, mask, uid = one_row_per_rollout(seed=1)
    ours = core_algos.get_adv_estimator_fn("agentbolt_rollout_rloo")
    a, _ = ours(rewards, mask, index=uid, rollout_index=list(range(len(uid))))
    va, _ = core_algos.compute_rloo_outcome_advantage(rewards, mask, index=uid)
    assert (a - va).abs().max().item() <= TOL


def multi_row_batch():
    """Rollouts with 1 to 3 calls each; under `final` credit every call carries the episode return."""
    returns = {"a": 1.0, "b": 0.0, "c": 0.0, "d": 1.0, "e": 0.5, "f": 0.0}
    calls = {"a": 3, "b": 1, "c": 1, "d": 1, "e": 2, "f": 1}
    group = {"a": "g1", "b": "g1", "c": "g1", "d": "g2", "e": "g2", "f": "g2"}
    transitions = [
        tr(
            rid,
            k,
            prompt=[1 + k, 2, 3],
            response=list(range(10, 12 + k + len(rid))),
            reward=returns[rid],
            group=group[rid],
        )
        for rid in returns
        for k in range(calls[rid])
    ]
    return build_batch(transitions, BatchOptions(max_prompt_length=16, max_response_length=16)), returns, group


def test_rollout_level_grpo_is_verl_grpo_over_rollouts_broadcast() -> None:
    batch, returns, group = multi_row_batch()
    t, nt = batch.tensors, batch.non_tensors
    a, _, stats = adv.compute_rollout_advantage(
        t["token_level_scores"], t["response_mask"], nt["uid"], nt["rollout_id"], nt["transition_index"]
    )
    # verl's GRPO on one row per rollout (scores of each rollout), then broadcast
    rids = list(returns)
    scores = torch.tensor([[returns[r]] for r in rids])
    va, _ = core_algos.compute_grpo_outcome_advantage(
        scores, torch.ones_like(scores), index=np.array([group[r] for r in rids], dtype=object)
    )
    expected = torch.stack([va[rids.index(r), 0] * t["response_mask"][i] for i, r in enumerate(nt["rollout_id"])])
    assert (a - expected).abs().max().item() <= TOL
    assert (stats.rollouts, stats.groups, stats.multi_row_rollouts, stats.max_rows_per_rollout) == (6, 2, 2, 3)
    # verl's row-level GRPO counts rollout "a" three times in g1 and gets different numbers
    row_level, _ = core_algos.compute_grpo_outcome_advantage(
        t["token_level_scores"], t["response_mask"], index=nt["uid"]
    )
    assert (row_level - a).abs().max().item() > 0.1


def test_score_comes_from_the_last_call() -> None:
    # discounted credit: earlier calls carry less; the rollout's score is its final call's reward
    transitions = [
        tr("a", 0, reward=0.81, group="g"),
        tr("a", 2, reward=1.0, group="g"),
        tr("a", 1, reward=0.9, group="g"),
        tr("b", 0, reward=0.0, group="g"),
    ]
    batch = build_batch(transitions, BatchOptions(max_prompt_length=8, max_response_length=8))
    t, nt = batch.tensors, batch.non_tensors
    a, _, _ = adv.compute_rollout_advantage(
        t["token_level_scores"], t["response_mask"], nt["uid"], nt["rollout_id"], nt["transition_index"]
    )
    va, _ = core_algos.compute_grpo_outcome_advantage(
        torch.tensor([[1.0], [0.0]]), torch.ones(2, 1), index=np.array(["g", "g"], dtype=object)
    )
    assert a[:3, 0].tolist() == pytest.approx([va[0, 0].item()] * 3, abs=TOL)
    assert a[3, 0].item() == pytest.approx(va[1, 0].item(), abs=TOL)


def test_singleton_groups_zero_or_raw() -> None:
    rewards, mask, uid = one_row_per_rollout(groups=(1, 2))
    ids = ["x", "y", "z"]
    raw, _, stats = adv.compute_rollout_advantage(rewards, mask, uid, ids, singleton_groups="raw")
    zero, _, _ = adv.compute_rollout_advantage(rewards, mask, uid, ids, singleton_groups="zero")
    assert stats.singleton_groups == 1
    assert raw[0].abs().sum() > 0 and zero[0].abs().sum() == 0
    assert torch.equal(raw[1:], zero[1:])


def test_rollout_weights_make_each_rollout_weigh_the_same() -> None:
    batch, _, _ = multi_row_batch()
    mask, rids = batch.tensors["response_mask"], list(batch.non_tensors["rollout_id"])
    w = adv.rollout_weights(mask, rids)
    b, tokens = len(rids), mask.sum(-1).double()
    per_rollout = {r: 0.0 for r in rids}
    for i, r in enumerate(rids):
        per_rollout[r] += float(w[i] * tokens[i])
    assert all(v == pytest.approx(b / 6) for v in per_rollout.values())
    weighted, returns, _ = adv.compute_rollout_advantage(
        batch.tensors["token_level_scores"], mask, batch.non_tensors["uid"], rids, aggregation="rollout-mean-token-mean"
    )
    assert torch.allclose(weighted, returns * w.unsqueeze(-1).float())


def test_through_verl_compute_advantage_with_membership_scope() -> None:
    from verl.trainer.ppo.ray_trainer import compute_advantage

    batch, _, _ = multi_row_batch()
    expected, _, _ = adv.compute_rollout_advantage(
        batch.tensors["token_level_scores"],
        batch.tensors["response_mask"],
        batch.non_tensors["uid"],
        batch.non_tensors["rollout_id"],
        batch.non_tensors["transition_index"],
        singleton_groups="zero",
        aggregation="rollout-mean-token-mean",
    )

    def fresh():
        dp = to_verl.to_dataproto(batch)
        dp.batch["token_level_rewards"] = dp.batch["token_level_scores"]
        return dp

    with pytest.raises(UserError, match="agentbolt_sync"):
        compute_advantage(fresh(), adv_estimator="agentbolt_rollout_grpo", config={"norm_adv_by_std_in_grpo": True})
    with adv.rollout_membership(
        batch.non_tensors["rollout_id"],
        batch.non_tensors["transition_index"],
        aggregation="rollout-mean-token-mean",
        singleton_groups="zero",
    ) as m:
        out = compute_advantage(
            fresh(), adv_estimator="agentbolt_rollout_grpo", config={"norm_adv_by_std_in_grpo": True}
        )
    assert (out.batch["advantages"] - expected).abs().max().item() <= TOL
    assert m.stats["agentbolt/advantage/rollouts"] == 6.0


def test_membership_from_verl_keys() -> None:
    rids, idx = adv.membership_from_verl_keys(["u_1_0", "u_1_2", "abc-def_x_0_1", "pad9_3_0"])
    assert rids == ["u_1", "u_1", "abc-def_x_0", "pad9_3"] and idx == [0, 2, 1, 0]
    with pytest.raises(SchemaError):
        adv.membership_from_verl_keys(["nounderscore"])


def test_inconsistent_groups_and_lengths_are_errors() -> None:
    rewards, mask, _ = one_row_per_rollout(groups=(2,))
    with pytest.raises(SchemaError, match="several groups"):
        adv.compute_rollout_advantage(rewards, mask, np.array(["g1", "g2"], dtype=object), ["r", "r"])
    with pytest.raises(SchemaError):
        adv.compute_rollout_advantage(rewards, mask, np.array(["g"], dtype=object), ["r", "s"])
    with pytest.raises(UserError, match="estimator must be one of"):
        adv.compute_rollout_advantage(rewards, mask, np.array(["g", "g"], dtype=object), ["r", "s"], estimator="gae")


def test_registered_in_verls_registry_idempotently() -> None:
    for name in adv.REGISTERED_ESTIMATORS:
        assert core_algos.get_adv_estimator_fn(name) is adv.ESTIMATORS[name]
    assert adv.register_estimators() == list(adv.REGISTERED_ESTIMATORS)
    other = lambda **kw: None  # noqa: E731
    other.__module__ = "someone.else"
    core_algos.ADV_ESTIMATOR_REGISTRY["agentbolt_rollout_rloo"] = other
    try:
        with pytest.raises(UserError, match=r"already registered by someone\.else"):
            adv.register_estimators()
    finally:
        core_algos.ADV_ESTIMATOR_REGISTRY["agentbolt_rollout_rloo"] = adv.ESTIMATORS["agentbolt_rollout_rloo"]


def test_reinforce_plus_plus_baseline_runs_per_rollout() -> None:
    batch, _, _ = multi_row_batch()
    t, nt = batch.tensors, batch.non_tensors
    fn = core_algos.get_adv_estimator_fn("agentbolt_rollout_reinforce_plus_plus_baseline")
    a, _ = fn(t["token_level_scores"], t["response_mask"], index=nt["uid"], rollout_index=nt["rollout_id"])
    per_rollout = {}
    for i, r in enumerate(nt["rollout_id"]):
        values = a[i][t["response_mask"][i].bool()]
        assert torch.allclose(values, values[0].expand_as(values))
        per_rollout.setdefault(r, values[0].item())
        assert values[0].item() == pytest.approx(per_rollout[r])
