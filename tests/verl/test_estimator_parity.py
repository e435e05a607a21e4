"""Core's advantage estimators against verl 0.9.1's own ``compute_*_advantage`` functions.

The same outcome rewards go through agentbolt's :mod:`agentbolt.lightningrl.advantage`
(one transition per rollout, ``final`` credit) and through verl's registered estimators
(``verl.trainer.ppo.core_algos``: a float64 ``token_level_rewards`` tensor holding the reward
on the last response token, a ``response_mask`` of random lengths, the group ids as ``index``).
Every advantage must agree within 1e-6, for every normalization option each side offers.

Where the two differ by design the test pins the difference instead of hiding it:

- **Groups of one.** verl gives a lone response the baseline 0 (GRPO: mean 0, std 1, so
  ``r / (1 + eps)``; RLOO: ``r``; REINFORCE++-baseline: ``r`` before whitening); core gives it
  advantage exactly 0 (no group, no signal; documented in ``advantage.py``). The parity
  batches therefore hold groups of two or more; :func:`test_group_of_one_is_the_documented_difference`
  checks the difference itself.
- **REINFORCE++ whitening.** verl whitens over the batch's response *tokens*
  (``masked_whiten``: token-weighted mean, Bessel correction over the token count, divisor
  ``sqrt(var + 1e-8)``); core whitens over rollouts (each rollout counts once, Bessel over the
  rollout count, divisor ``std + epsilon``). They agree when every response is one token and
  core's ``epsilon`` is 0; with longer responses verl's variance is the rollouts' one scaled by
  ``L (J - 1) / (J L - 1)`` for J responses of L tokens, which the test checks too.
  verl's ``1e-8`` under the square root moves an advantage by less than 1e-6 only when the
  whitened values' variance is at least 0.05, so the REINFORCE++ batches are drawn with that spread.
- **Plain REINFORCE++** (verl's ``reinforce_plus_plus``: discounted returns, whitened, no group
  baseline) has no estimator of its own in core; with outcome rewards on one-token responses it
  equals core's ``ReinforcePlusPlus`` over a batch that forms a single group (whitening removes
  the shared mean), which is what the test compares.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from agentbolt.lightningrl import GRPO, RLOO, ReinforcePlusPlus
from agentbolt.types import Transition

core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
verl_version = pytest.importorskip("verl").__version__

TOLERANCE = 1e-6


def test_the_reference_is_verl_0_9_1() -> None:
    assert verl_version == "0.9.1"


def verl_estimator(name: str) -> Any:
    """verl's own function, looked up the way its trainer does (``get_adv_estimator_fn``)."""
    return core_algos.get_adv_estimator_fn(name)


def transitions(groups: list[list[float]]) -> list[Transition]:
    return [
        Transition(rollout_id=f"g{g}-r{j}", group_id=f"g{g}", index=0, prompt_ids=[1], response_ids=[2], reward=x)
        for g, rewards in enumerate(groups)
        for j, x in enumerate(rewards)
    ]


def verl_inputs(groups: list[list[float]], lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """float64 token-level rewards (the reward on each response's last token), response mask, group index."""
    rewards = [x for g in groups for x in g]
    width = max(lengths)
    token_rewards = torch.zeros(len(rewards), width, dtype=torch.float64)
    mask = torch.zeros(len(rewards), width, dtype=torch.float64)
    for i, (x, n) in enumerate(zip(rewards, lengths, strict=True)):
        mask[i, :n] = 1.0
        token_rewards[i, n - 1] = x
    index = np.array([f"g{g}" for g, rs in enumerate(groups) for _ in rs], dtype=object)
    return token_rewards, mask, index


def per_response(advantages: torch.Tensor, mask: torch.Tensor) -> list[float]:
    """The advantage of each response: verl broadcasts one value over the response's tokens."""
    out = []
    for row, m in zip(advantages, mask, strict=True):
        values = row[m.bool()]
        assert torch.allclose(values, values[0].expand_as(values), atol=1e-12, rtol=0)
        out.append(float(values[0]))
    return out


def core(estimator: Any, groups: list[list[float]]) -> list[float]:
    result = estimator.estimate(transitions(groups))
    return [t.advantage for t in result.transitions]


def assert_close(ours: list[float], theirs: list[float]) -> None:
    assert len(ours) == len(theirs)
    worst = max(abs(a - b) for a, b in zip(ours, theirs, strict=True))
    assert worst <= TOLERANCE, (ours, theirs)


reward = st.one_of(
    st.sampled_from([0.0, 0.1, 1.0]), st.floats(min_value=-5.0, max_value=5.0, allow_nan=False, width=64)
)
group = st.lists(reward, min_size=2, max_size=6)
batches = st.lists(group, min_size=1, max_size=5)


def lengths_for(groups: list[list[float]], data: st.DataObject) -> list[int]:
    n = sum(len(g) for g in groups)
    return data.draw(st.lists(st.integers(min_value=1, max_value=7), min_size=n, max_size=n))


@settings(max_examples=80, deadline=None)
@given(groups=batches, norm_std=st.booleans(), epsilon=st.sampled_from([1e-6, 1e-4, 0.1, 0.0]), data=st.data())
def test_grpo_equals_verl(groups: list[list[float]], norm_std: bool, epsilon: float, data: st.DataObject) -> None:
    lengths = lengths_for(groups, data)
    token_rewards, mask, index = verl_inputs(groups, lengths)
    ours = core(GRPO(norm_std=norm_std, epsilon=epsilon), groups)
    if epsilon == 0.0 and norm_std and any(len(set(g)) == 1 for g in groups):
        # verl divides 0 by std 0 (NaN); core gives an all-equal group exactly 0. Same intent
        # (no signal), only core says it without a NaN.
        return
    advantages, _ = verl_estimator("grpo")(
        token_level_rewards=token_rewards.clone(),
        response_mask=mask,
        index=index,
        epsilon=epsilon,
        norm_adv_by_std_in_grpo=norm_std,
    )
    assert_close(ours, per_response(advantages, mask))


@settings(max_examples=80, deadline=None)
@given(groups=batches, data=st.data())
def test_rloo_equals_verl(groups: list[list[float]], data: st.DataObject) -> None:
    token_rewards, mask, index = verl_inputs(groups, lengths_for(groups, data))
    advantages, _ = verl_estimator("rloo")(token_level_rewards=token_rewards.clone(), response_mask=mask, index=index)
    assert_close(core(RLOO(), groups), per_response(advantages, mask))


def spread(groups: list[list[float]]) -> bool:
    """Whether the group-centred rewards vary across the batch enough (variance >= 0.05) that
    verl's ``sqrt(var + 1e-8)`` and core's ``std`` (epsilon 0) differ by less than 1e-6 in an advantage."""
    centred = [x - math.fsum(g) / len(g) for g in groups for x in g]
    mean = math.fsum(centred) / len(centred)
    return math.fsum((c - mean) ** 2 for c in centred) / max(len(centred) - 1, 1) >= 0.05


@settings(max_examples=80, deadline=None)
@given(groups=batches)
def test_reinforce_pp_baseline_equals_verl_on_one_token_responses(groups: list[list[float]]) -> None:
    assume(spread(groups))  # counted by Hypothesis: a filter that rejects nearly every draw fails the test
    token_rewards, mask, index = verl_inputs(groups, [1] * sum(len(g) for g in groups))
    advantages, _ = verl_estimator("reinforce_plus_plus_baseline")(
        token_level_rewards=token_rewards.clone(), response_mask=mask, index=index
    )
    assert_close(core(ReinforcePlusPlus(epsilon=0.0), groups), per_response(advantages, mask))


@settings(max_examples=60, deadline=None)
@given(groups=batches, length=st.integers(min_value=2, max_value=6))
def test_reinforce_pp_token_whitening_is_the_documented_difference(groups: list[list[float]], length: int) -> None:
    """With J responses of L tokens verl's whitening variance is core's x L (J - 1) / (J L - 1)."""
    assume(spread(groups))  # counted by Hypothesis: a filter that rejects nearly every draw fails the test
    n = sum(len(g) for g in groups)
    token_rewards, mask, index = verl_inputs(groups, [length] * n)
    advantages, _ = verl_estimator("reinforce_plus_plus_baseline")(
        token_level_rewards=token_rewards.clone(), response_mask=mask, index=index
    )
    theirs = per_response(advantages, mask)
    ours = core(ReinforcePlusPlus(epsilon=0.0), groups)
    scale = math.sqrt((n * length - 1) / (length * (n - 1)))  # verl's 1/std over the rollouts' 1/std
    assert_close([a * scale for a in ours], theirs)


@settings(max_examples=60, deadline=None)
@given(rewards=st.lists(reward, min_size=2, max_size=12), gamma=st.sampled_from([1.0, 0.9]))
def test_plain_reinforce_pp_equals_core_over_one_group(rewards: list[float], gamma: float) -> None:
    from verl.trainer.config import AlgoConfig

    assume(spread([rewards]))
    token_rewards, mask, _ = verl_inputs([rewards], [1] * len(rewards))
    advantages, _ = verl_estimator("reinforce_plus_plus")(
        token_level_rewards=token_rewards.clone(), response_mask=mask, config=AlgoConfig(gamma=gamma)
    )
    assert_close(core(ReinforcePlusPlus(epsilon=0.0), [rewards]), per_response(advantages, mask))


def test_whiten_off_is_the_group_centred_reward() -> None:
    """Core's ``whiten=False`` is verl's REINFORCE++-baseline before ``masked_whiten``: r - group mean."""
    groups = [[1.0, 0.0, 0.1, 1.0], [0.1, 0.1, 1.0]]
    expected = [x - sum(g) / len(g) for g in groups for x in g]
    assert_close(core(ReinforcePlusPlus(whiten=False), groups), expected)


@pytest.mark.parametrize(
    ("estimator", "name", "verl_value"),
    [
        (GRPO(), "grpo", lambda r: r / (1.0 + 1e-6)),
        (RLOO(), "rloo", lambda r: r),
    ],
)
def test_group_of_one_is_the_documented_difference(estimator: Any, name: str, verl_value: Any) -> None:
    groups = [[0.7], [1.0, 0.0]]
    token_rewards, mask, index = verl_inputs(groups, [3, 2, 4])
    advantages, _ = verl_estimator(name)(token_level_rewards=token_rewards.clone(), response_mask=mask, index=index)
    theirs = per_response(advantages, mask)
    ours = core(estimator, groups)
    assert ours[0] == 0.0 and theirs[0] == pytest.approx(verl_value(0.7), abs=1e-6)
    assert_close(ours[1:], theirs[1:])
