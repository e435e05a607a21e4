"""Rewards are validated where they enter (issue 38): ``emit_reward``, an agent's return value,
OTLP spans. A hostile value (overflowing, non-finite, text, bool, nested, huge) is refused with
an error that says what is wrong, and nothing is recorded; ``agentbolt doctor`` names the stored
values training quarantines."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.capture.emit import emit_reward
from agentbolt.capture.tracing import RolloutContext, SpanSink, rollout_context
from agentbolt.errors import UserError
from agentbolt.reward_validation import MAX_ABS_REWARD, RewardBounds, RewardRefused, reward_number
from agentbolt.runs.doctor import diagnose
from agentbolt.store.memory import MemoryStore
from agentbolt.store.server import ServerThread
from agentbolt.store.server.otlp_json import spans_to_otlp_json
from agentbolt.testing.hostile import HOSTILE_REWARDS, STORABLE_HOSTILE_REWARDS, is_hostile

hostile = st.one_of(
    st.sampled_from([v for v in HOSTILE_REWARDS if not isinstance(v, Mapping)]),
    st.floats(allow_nan=True, allow_infinity=True).filter(is_hostile),
    st.integers().filter(lambda n: abs(n) > MAX_ABS_REWARD),
    st.text(max_size=10),
    st.lists(st.floats(-1, 1), max_size=20),
)


@settings(max_examples=200, deadline=None)
@given(st.floats(-MAX_ABS_REWARD, MAX_ABS_REWARD) | st.integers(-(10**15), 10**15))
def test_numbers_within_the_bound_are_accepted_as_they_are(value: float) -> None:
    assert reward_number(value) == float(value)


@settings(max_examples=300, deadline=None)
@given(hostile)
def test_every_hostile_value_is_refused_with_a_reason(value: Any) -> None:
    with pytest.raises(RewardRefused) as caught:
        reward_number(value, "the reward")
    assert caught.value.reason in {"not_a_number", "non_finite", "too_large"}
    assert str(caught.value).startswith("the reward must be") and len(str(caught.value)) < 400


def test_bounds_refuse_or_clip_outside_the_range() -> None:
    assert RewardBounds((0, 1)).check(0.5) == (0.5, False)
    assert RewardBounds((0, 1), "clip").check(7) == (1.0, True)
    with pytest.raises(RewardRefused, match=r"outside the declared reward_range \[0, 1\]"):
        RewardBounds((0, 1)).check(-0.1)
    with pytest.raises(RewardRefused, match="must be a number"):
        RewardBounds((0, 1), "clip").check(True)  # clipping never turns a wrong type into a reward
    with pytest.raises(UserError, match="low <= high"):
        RewardBounds((1, 0))


async def _context() -> tuple[MemoryStore, SpanSink, RolloutContext]:
    store = MemoryStore(sweep_interval_s=0)
    await store.enqueue([t.RolloutSpec(rollout_id="r")])
    (claim,) = await store.dequeue("w")
    sink = SpanSink(store, interval_s=0.01)
    sink.start()
    return store, sink, RolloutContext("r", claim.attempt.attempt_id, sink)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=hostile, as_dimension=st.booleans())
def test_emit_reward_refuses_hostile_values_and_records_nothing(value: Any, as_dimension: bool) -> None:
    async def scenario() -> None:
        store, sink, ctx = await _context()
        with rollout_context(ctx), pytest.raises(UserError, match="must be"):
            emit_reward({"score": value} if as_dimension else value)
        with rollout_context(ctx):
            emit_reward(0.5)  # the rollout goes on
        await sink.close()
        spans = (await store.query_spans(["r"]))["r"]
        assert [s.attributes[semconv.REWARD_VALUE] for s in spans] == [0.5] and ctx.rewards == [(0.5, False)]

    asyncio.run(scenario())


@pytest.mark.parametrize("value", [True, 1e308, "1", float("nan"), 10**400, [1.0]])
async def test_an_agent_returning_a_hostile_value_fails_its_rollout_clearly(value: Any) -> None:
    from agentbolt.runners.runner import Runner, RunnerConfig

    store = MemoryStore(sweep_interval_s=0)
    await store.enqueue([t.RolloutSpec(rollout_id="bad", input=1), t.RolloutSpec(rollout_id="good", input=2)])
    runner = Runner(
        lambda task, resources: value if task == 1 else 0.5,
        store,
        config=RunnerConfig(exit_when_idle_s=0.5, dequeue_wait_s=0.2, adapters=[]),
    )
    await asyncio.wait_for(runner.run(), 60)
    bad, good = await store.get_rollouts(["bad", "good"])
    assert bad.status is t.RolloutStatus.FAILED and bad.error is not None and bad.error.kind is t.ErrorKind.AGENT
    assert "the agent's return value must be" in bad.error.message and bad.final_reward is None
    assert good.status is t.RolloutStatus.SUCCEEDED and good.final_reward == 0.5


def test_otlp_reward_spans_with_hostile_values_are_rejected_the_rest_stored() -> None:
    store = MemoryStore(sweep_interval_s=0)
    asyncio.run(store.enqueue([t.RolloutSpec(rollout_id="r0")]))
    (claim,) = asyncio.run(store.dequeue("w"))
    aid = claim.attempt.attempt_id

    def reward(value: Any, name: str) -> t.Span:
        span = t.Span.create(semconv.SPAN_REWARD, rollout_id="r0", attempt_id=aid)
        attrs = {semconv.SPAN_KIND_ATTR: semconv.KIND_REWARD, semconv.REWARD_VALUE: value, "n": name}
        return span.model_construct(**{**dict(span), "attributes": attrs})

    def primary(value: Any, name: str) -> t.Span:
        """A reward given only as the primary of named dimensions (no agentbolt.reward.value)."""
        span = reward(0.0, name)
        attrs = {k: v for k, v in span.attributes.items() if k != semconv.REWARD_VALUE}
        attrs[semconv.REWARD_PRIMARY] = "score"
        attrs[semconv.REWARD_DIMENSIONS] = orjson.dumps({"score": value, "style": 0.5}, default=repr).decode()
        return span.model_construct(**{**dict(span), "attributes": attrs})

    spans = [reward(v, f"bad{i}") for i, v in enumerate(STORABLE_HOSTILE_REWARDS)] + [reward(0.75, "good")]
    spans += [primary("1", "bad-primary"), primary([0.5], "bad-primary-list"), primary(0.25, "good-primary")]
    with ServerThread(store) as server, httpx.Client(timeout=30) as http:
        body = orjson.dumps(spans_to_otlp_json(spans))
        answer = http.post(server.url + "/v1/traces", content=body, headers={"content-type": "application/json"})
    assert answer.status_code == 200, answer.text
    partial = answer.json()["partialSuccess"]
    assert int(partial["rejectedSpans"]) == len(STORABLE_HOSTILE_REWARDS) + 2
    assert "must be" in partial["errorMessage"]
    stored = asyncio.run(store.query_spans(["r0"]))["r0"]
    assert [s.attributes["n"] for s in stored] == ["good", "good-primary"]


def test_doctor_names_stored_values_training_quarantines() -> None:
    good = t.Rollout(rollout_id="ok", task_id="t", status=t.RolloutStatus.SUCCEEDED, current_attempt_id="a1")
    poisoned = good.model_copy(update={"rollout_id": "big", "current_attempt_id": "a2", "final_reward": 1e308})
    report = diagnose([good, poisoned], {"ok": [], "big": []})
    finding = report.finding("quarantined_values")
    assert finding is not None and finding.count == 1 and finding.severity == "warning"
    assert "too_large x1" in finding.message and "big:" in finding.message and "1e15" in finding.fix
    assert "quarantined_values" in report.render()
