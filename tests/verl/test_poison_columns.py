"""verl's advantage step never stops on a hostile credit: the row's rollout is quarantined with a
reason (metrics), its rows train nothing (mask 0), the other rows get finite advantages, and the
registered loss on the columns is finite with finite gradients (the update goes on)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from agentbolt.lightningrl import LightningRLConfig
from agentbolt.testing.hostile import HOSTILE_REWARDS, is_hostile
from agentbolt_verl.columns import verl_columns
from agentbolt_verl.losses import compute_policy_loss_agentbolt

pytestmark = pytest.mark.filterwarnings("ignore:.*engine is not available:UserWarning")

hostile = st.one_of(
    st.sampled_from(HOSTILE_REWARDS),
    st.floats(allow_nan=True, allow_infinity=True).filter(is_hostile),
    st.text(max_size=10),
)


def _rows(rollouts: int, poisoned: int, value: Any) -> tuple[list[dict[str, Any]], list[list[int]], list[list[int]]]:
    """Two calls per rollout, two groups; rollout ``poisoned`` carries ``value`` as its credit."""
    extras, prompts, responses = [], [], []
    for r in range(rollouts):
        for index in range(2):
            extras.append(
                {
                    "rollout_id": f"r{r}",
                    "group_id": f"g{r % 2}",
                    "index": index,
                    "agent_name": None,
                    "reward": value if r == poisoned else 0.25 * r,
                    "policy_version": 0,
                    "resources_version": 0,
                    "span_id": f"s{r}-{index}",
                    "merged_indices": None,
                }
            )
            prompts.append([1, 2, 3 + index])
            responses.append([4, 5, 6][: 2 + index])
    return extras, prompts, responses


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=hostile, rollouts=st.integers(3, 6), data=st.data(), advantage=st.sampled_from(["grpo", "rloo"]))
def test_a_hostile_credit_is_quarantined_and_the_step_goes_on(
    value: Any, rollouts: int, data: st.DataObject, advantage: str
) -> None:
    poisoned = data.draw(st.integers(0, rollouts - 1))
    extras, prompts, responses = _rows(rollouts, poisoned, value)
    width = max(len(r) for r in responses)
    mask = torch.zeros((len(extras), width), dtype=torch.int64)
    for i, r in enumerate(responses):
        mask[i, : len(r)] = 1
    columns = verl_columns(extras, prompts, responses, mask, LightningRLConfig(advantage=advantage), trained_version=0)
    report = columns.batch.report if columns.batch is not None else None
    assert report is not None and [q.rollout_id for q in report.quarantined] == [f"r{poisoned}"]
    assert columns.metrics["agentbolt/lightningrl/quarantined"] == 1.0
    for i, extra in enumerate(extras):
        assert bool(columns.response_mask[i].any()) == (extra["rollout_id"] != f"r{poisoned}")
    assert torch.isfinite(columns.advantages).all() and torch.isfinite(columns.loss_weight).all()

    old = torch.full(mask.shape, -0.5)
    log_prob = old.clone().requires_grad_(True)
    config = OmegaConf.create(
        {
            "clip_ratio": 0.2,
            "clip_ratio_low": 0.2,
            "clip_ratio_high": 0.28,
            "clip_ratio_c": 3.0,
            "global_batch_info": {"dp_size": 1, "global_batch_size": len(extras), "batch_num_tokens": None},
        }
    )
    loss, _ = compute_policy_loss_agentbolt(
        old_log_prob=old,
        log_prob=log_prob,
        advantages=columns.advantages,
        response_mask=columns.response_mask,
        config=config,
        rollout_is_weights=columns.loss_weight,
    )
    (grad,) = torch.autograd.grad(loss, log_prob)
    assert math.isfinite(float(loss.detach())) and torch.isfinite(grad).all()
