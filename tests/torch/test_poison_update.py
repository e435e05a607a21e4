"""The torch updater's next update succeeds whatever hostile reward a batch's store holds: the
rollout carrying it is quarantined by LightningRL with a reason, the others' rows train with a
finite loss, and the weights change by finite amounts (no NaN reaches the policy)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentbolt import semconv
from agentbolt.lightningrl import LightningRL
from agentbolt.testing.hostile import STORABLE_HOSTILE_REWARDS, is_hostile
from agentbolt.types import Rollout, RolloutStatus, Span
from agentbolt_torch.models import tiny_model
from agentbolt_torch.policy import Policy
from agentbolt_torch.update import PolicyUpdater, UpdateConfig


@pytest.fixture(scope="module")
def updater() -> PolicyUpdater:
    model, tokenizer = tiny_model(seed=0)
    return PolicyUpdater(Policy(model, tokenizer, name="tiny", autocast_dtype=None), UpdateConfig(seed=0))


def _rollout(i: int, reward: Any, where: str) -> tuple[Rollout, list[Span]]:
    """One call (token ids in the tiny vocabulary) and a final reward span; ``where`` says whether
    the hostile value sits in the span or in the rollout's own final reward."""
    rid = f"r{i}"
    call = Span.create(
        semconv.SPAN_LLM_CALL,
        rollout_id=rid,
        attempt_id=f"at-{rid}",
        attributes={
            semconv.SPAN_KIND_ATTR: semconv.KIND_LLM,
            semconv.GEN_AI_OPERATION_NAME: semconv.OP_CHAT,
            semconv.GEN_AI_RESPONSE_ID: f"chatcmpl-{rid}",
            semconv.TOKEN_SOURCE: "exact",
            semconv.PROMPT_TOKEN_IDS: [10 + i, 20, 30],
            semconv.RESPONSE_TOKEN_IDS: [40 + i, 50],
            semconv.RESPONSE_LOGPROBS: [-1.0, -1.5],
            semconv.POLICY_VERSION: 0,
            semconv.LLM_RESPONSE: json.dumps({"id": f"chatcmpl-{rid}", "choices": []}),
        },
    ).model_copy(update={"seq": 1})
    spans = [call]
    final: Any = None
    if where == "span":
        reward_span = Span.create(
            semconv.SPAN_REWARD,
            rollout_id=rid,
            attempt_id=f"at-{rid}",
            attributes={semconv.SPAN_KIND_ATTR: semconv.KIND_REWARD, semconv.REWARD_IS_FINAL: True},
        ).model_copy(update={"seq": 2})
        # stored as a foreign writer could (OTLP attribute types: str, bool, number, lists)
        attrs = {**reward_span.attributes, semconv.REWARD_VALUE: reward}
        spans.append(reward_span.model_construct(**{**dict(reward_span), "attributes": attrs}))
    else:
        final = reward
    rollout = Rollout.model_construct(
        **{
            **dict(Rollout(rollout_id=rid, group_id="g", task_id="t", status=RolloutStatus.SUCCEEDED)),
            "current_attempt_id": f"at-{rid}",
            "final_reward": final,
        }
    )
    return rollout, spans


hostile = st.one_of(
    st.sampled_from(STORABLE_HOSTILE_REWARDS),
    st.floats(allow_nan=True, allow_infinity=True).filter(is_hostile),
)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=hostile, where=st.sampled_from(["span", "final_reward"]), poisoned=st.integers(0, 3))
def test_the_update_after_a_hostile_reward_succeeds(
    updater: PolicyUpdater, value: Any, where: str, poisoned: int
) -> None:
    pairs = [_rollout(i, value if i == poisoned else 0.25 * i, where if i == poisoned else "span") for i in range(4)]
    rollouts = [r for r, _ in pairs]
    spans = {r.rollout_id: s for r, s in pairs}
    batch = LightningRL().process(rollouts, spans, policy_version=0)
    assert [
        (q.rollout_id, q.reason in {"not_a_number", "non_finite", "too_large"}) for q in batch.report.quarantined
    ] == [(f"r{poisoned}", True)]
    assert {row.rollout_id for row in batch.rows} == {f"r{i}" for i in range(4)} - {f"r{poisoned}"}
    before = {k: v.detach().clone() for k, v in updater.policy.model.named_parameters() if v.requires_grad}
    metrics = updater.update(batch.rows)
    assert math.isfinite(metrics.pg_loss)
    after = dict(updater.policy.model.named_parameters())
    assert all(torch.isfinite(after[k]).all() for k in before)
    assert any(not torch.equal(before[k], after[k]) for k in before), "the update trained"
