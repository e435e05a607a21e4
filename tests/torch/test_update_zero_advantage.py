"""Rows whose gradient is exactly zero are left out of the update's passes
(``UpdateConfig.skip_zero_advantage``): the same optimizer step, fewer forward/backward passes."""

from __future__ import annotations

import random

import pytest
import torch

from agentbolt.types import Transition
from agentbolt_torch.generation.engine import GenerationEngine, SamplingParams
from agentbolt_torch.models import tiny_model
from agentbolt_torch.policy import Policy
from agentbolt_torch.update.updater import PolicyUpdater, UpdateConfig

PROMPTS = ["What is 2 + 3?", "Add them: 17 and 25, then tell me", "x", "What is 9 - 4?"]


def fresh_policy() -> Policy:
    torch.manual_seed(0)
    model, tokenizer = tiny_model(seed=0)
    return Policy(model, tokenizer, name="tiny", autocast_dtype=None)


def grpo_rows(policy: Policy, advantages: list[list[float]]) -> list[Transition]:
    """One GRPO group per prompt, ``advantages[g]`` its samples' advantages (real sampled responses)."""
    tok = policy.tokenizer
    rng = random.Random(1)
    rows = []
    with GenerationEngine(policy, batch_window_s=0, seed=2) as engine:
        for g, group in enumerate(advantages):
            prompt = tok(PROMPTS[g % len(PROMPTS)])["input_ids"]
            for k, advantage in enumerate(group):
                completion = engine.generate(prompt, SamplingParams(max_tokens=rng.randint(1, 12)), timeout=60)[0]
                rows.append(
                    Transition(
                        rollout_id=f"g{g}-{k}",
                        group_id=f"g{g}",
                        index=0,
                        prompt_ids=prompt,
                        response_ids=completion.token_ids,
                        response_logprobs=completion.logprobs,
                        advantage=advantage,
                    )
                )
    return rows


def weights(policy: Policy) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in policy.model.named_parameters() if v.requires_grad}


def run(skip: bool, batches: list[list[list[float]]], **config: float) -> tuple[list, dict[str, torch.Tensor]]:
    """Fresh identical policies, the same batches in order; the metrics of each update and the final weights."""
    policy = fresh_policy()
    data = [grpo_rows(policy, advantages) for advantages in batches]
    # eps=1 makes AdamW's step ~ -lr * grad (not lr * sign(grad)), so the weights compare gradients
    updater = PolicyUpdater(policy, UpdateConfig(lr=1.0, eps=1.0, skip_zero_advantage=skip, **config))
    return [updater.update(rows) for rows in data], weights(policy)


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], start: dict[str, torch.Tensor]) -> None:
    scale = max((a[k] - start[k]).abs().max().item() for k in a)
    assert scale > 1e-4  # the update moved the weights
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5 * scale


MIXED = [[0.0, 0.0, 0.0, 0.0], [0.5, -0.5, 0.0, 0.0], [1.0, -1.0, 0.3, -0.3], [0.0, 0.0, 0.0, 0.0]]


def test_skipping_zero_advantage_rows_gives_the_same_update() -> None:
    start = weights(fresh_policy())
    (skipped,), w_skip = run(True, [MIXED])
    (full,), w_full = run(False, [MIXED])
    assert_same_weights(w_skip, w_full, start)
    zeros = sum(a == 0.0 for group in MIXED for a in group)
    assert (skipped.zero_advantage_skipped, full.zero_advantage_skipped) == (zeros, 0)
    assert skipped.n_transitions == full.n_transitions == 16  # skipped rows still count as trained rows
    assert skipped.pg_loss == pytest.approx(full.pg_loss, abs=1e-6)
    assert skipped.grad_norm == pytest.approx(full.grad_norm, rel=1e-5)
    assert skipped.micro_batches >= 1 and skipped.tokens_per_s * skipped.seconds < full.tokens_per_s * full.seconds


def test_a_batch_of_zero_advantages_still_takes_the_adamw_step() -> None:
    """Zero gradients still move the weights through AdamW's moments: skipping every row must not
    skip the step (a parameter without a gradient would be left out of it)."""
    batches = [MIXED, [[0.0] * 4, [0.0] * 4]]
    start = weights(fresh_policy())
    skipped, w_skip = run(True, batches)
    full, w_full = run(False, batches)
    assert skipped[1].micro_batches == 0 and skipped[1].optimizer_steps == 1 and skipped[1].grad_norm == 0.0
    assert full[1].micro_batches >= 1
    assert_same_weights(w_skip, w_full, start)


@pytest.mark.parametrize("term", ["kl_coef", "entropy_coef"])
def test_rows_are_kept_when_a_kl_or_entropy_term_gives_them_a_gradient(term: str) -> None:
    (metrics,), _ = run(True, [MIXED], **{term: 0.1})
    assert metrics.zero_advantage_skipped == 0


def test_zero_advantage_skips_count_every_zero_row() -> None:
    """Invariant over random batches: skipped + rows run == rows, and the skipped ones are exactly
    the zero-advantage rows."""
    rng = random.Random(3)
    for _ in range(3):
        batch = [[rng.choice([0.0, 0.0, 0.7, -0.4]) for _ in range(3)] for _ in range(3)]
        (metrics,), _ = run(True, [batch])
        assert metrics.zero_advantage_skipped == sum(a == 0.0 for g in batch for a in g)
