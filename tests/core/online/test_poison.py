"""Issue 38: no reward halts agentbolt serve's training.

- At the door: every hostile reward (``1e200``, ``1e308``, ``"-inf"``, ``"1"``, ``true``, objects,
  huge arrays, ...) in ``reward`` or ``dimensions`` is a 422 that says what is wrong, and nothing
  is stored (a Hypothesis property on the body model, the whole list over HTTP). The serve
  config's ``reward_range`` refuses (422) or clips as configured.
- Behind the door: a stored value that would stop the step (written before this check, or by
  another writer) quarantines its session with a reason (ledger, metrics); the update trains
  the others and the live version moves; the next check finds nothing to retry.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from agentbolt import semconv
from agentbolt.lightningrl import GRPO
from agentbolt.online import OnlineServer, SessionOptions, UpdateOptions
from agentbolt.online.feedback import Feedback, reward_span
from agentbolt.testing.hostile import HOSTILE_REWARDS, is_hostile
from agentbolt.testing.scripted_policy import ScriptedPolicy

from .helpers import TOKEN, db, openai_client, post_feedback, reward_spans


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


JSON_HOSTILE = [v for v in HOSTILE_REWARDS if _jsonable(v) and v is not None]
hostile_json = st.one_of(
    st.sampled_from(JSON_HOSTILE),
    st.floats(allow_nan=False, allow_infinity=False).filter(is_hostile),
    st.integers().filter(is_hostile),
    st.text(max_size=12),
    st.lists(st.floats(-1, 1), max_size=30),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=3),
)


@settings(max_examples=300, deadline=None)
@given(value=hostile_json, in_dimensions=st.booleans())
def test_the_feedback_body_refuses_every_hostile_reward(value: Any, in_dimensions: bool) -> None:
    body = {"feedback_id": "f", "session_id": "s", "reward": 1.0}
    if in_dimensions:
        body["dimensions"] = {"x": value}
    else:
        body["reward"] = value
    with pytest.raises(ValidationError) as caught:
        Feedback.model_validate_json(json.dumps(body, allow_nan=False))
    assert ("dimensions" if in_dimensions else "reward") in str(caught.value)


def _server(tmp_path: Path, policy: Any, **updates: Any) -> OnlineServer:
    return OnlineServer(
        db(tmp_path),
        policy,
        state_dir=tmp_path / "state",
        token=TOKEN,
        sessions=SessionOptions(idle_s=60),
        updates=UpdateOptions(min_sessions=3, grouping="batch", check_every_s=3600, **updates),
        metrics_every_s=3600,
    )


def _policy() -> ScriptedPolicy:
    return ScriptedPolicy({"base": "Paris.", "next": "Paris!"}, initial="base", updates=["next"])


async def _session(server: OnlineServer, name: str) -> str:
    client = openai_client(server, **{"X-Agentbolt-Session-Id": name})
    await client.chat.completions.create(model="any", messages=[{"role": "user", "content": f"Capital? {name}"}])
    return server.sessions.current[name].rollout_id


async def test_hostile_feedback_is_a_422_over_http_and_stores_nothing(tmp_path: Path) -> None:
    async with _server(tmp_path, _policy()) as server:
        rollout_id = await _session(server, "s")
        for value in JSON_HOSTILE:
            for body in (
                {"feedback_id": "f", "session_id": "s", "reward": value},
                {"feedback_id": "f", "session_id": "s", "reward": 1.0, "dimensions": {"x": value}},
            ):
                answer = await post_feedback(server, body)
                assert answer.status_code == 422, (value, answer.text)
                message = answer.json()["error"]["message"]
                assert "must be" in message and "Traceback" not in message, message
        assert await reward_spans(server, rollout_id) == []
        assert not server.sessions.current["s"].has_final


async def test_reward_range_refuses_or_clips_feedback(tmp_path: Path) -> None:
    async with _server(tmp_path / "refuse", _policy(), lightningrl={"reward_range": (0, 1)}) as server:
        await _session(server, "s")
        answer = await post_feedback(server, {"feedback_id": "f", "session_id": "s", "reward": 5})
        assert answer.status_code == 422 and "outside the declared reward_range [0, 1]" in answer.text
        assert (await post_feedback(server, {"feedback_id": "g", "session_id": "s", "reward": 1})).status_code == 200
    clip = {"reward_range": (0, 1), "reward_out_of_range": "clip"}
    async with _server(tmp_path / "clip", _policy(), lightningrl=clip) as server:
        rollout_id = await _session(server, "s")
        answer = await post_feedback(server, {"feedback_id": "f", "session_id": "s", "reward": -3})
        assert answer.status_code == 200
        [span] = await reward_spans(server, rollout_id)
        assert span.attributes[semconv.REWARD_VALUE] == 0.0


@pytest.mark.parametrize("value", [1e200, 1e308, -1e308, 2**62])
async def test_a_stored_poison_reward_is_quarantined_and_the_update_goes_live(tmp_path: Path, value: float) -> None:
    """The issue's case: ``{"reward": 1e200}`` got stored (the door let it through then); every
    update failed with OverflowError and the same batch was retried every 5 s forever."""
    policy = _policy()
    async with _server(tmp_path, policy) as server:
        ids = [await _session(server, f"u{i}") for i in range(4)]
        for i in range(3):
            ok = await post_feedback(server, {"feedback_id": f"f{i}", "session_id": f"u{i}", "reward": 0.3 * i})
            assert ok.status_code == 200
        # the poison, as an older serve (or another writer) stored it: past the door
        session = server.sessions.current["u3"]
        span = reward_span(session, feedback_id="poison", reward=value, final=True, source="client")
        await server.store.add_spans([span])
        session.rewards += 1
        session.has_final = True
        for i in range(4):
            await server.sessions.close(f"u{i}")
        live_before = server.live_version

        decision = await server.trainer.step()

        assert decision is not None and decision.passed and server.live_version > live_before
        assert policy.rows_seen == [3], "the three good sessions trained"
        assert set(ids) <= server.trained, "every session of the batch is marked: nothing is retried"
        [entry] = [e for e in server.ledger.replay() if e["event"] == "quarantined"]
        [quarantined] = entry["sessions"]
        assert quarantined["rollout_id"] == ids[3] and quarantined["reason"] == "too_large"
        assert "1e15" in quarantined["detail"]
        assert await server.trainer.step(force=True) is None, "nothing left to retry"
        metrics = await server.store.get_run_metrics(server.run_id)
        assert any(m.values.get("lightningrl/quarantined/too_large") == 1.0 for m in metrics)
        assert all(math.isfinite(v) for m in metrics for v in m.values.values())


class _FailsOnOneSession(GRPO):
    """An estimator (a plugin's, say) that raises whenever one given session is in its batch."""

    def __init__(self) -> None:
        super().__init__()
        self.culprit: str | None = None

    def estimate(self, transitions: Any) -> Any:
        if any(t.rollout_id == self.culprit for t in transitions):
            raise ZeroDivisionError("a plugin's arithmetic failed")
        return super().estimate(transitions)


async def test_an_update_that_raises_all_the_same_quarantines_the_culprit_not_the_batch(tmp_path: Path) -> None:
    """The backstop: whatever makes LightningRL raise on the batch, each session is processed
    alone, the one that raises is quarantined (``error``), the others train; nothing is retried."""
    policy, estimator = _policy(), _FailsOnOneSession()
    async with _server(tmp_path, policy, lightningrl={"advantage": estimator, "credit": "final"}) as server:
        ids = [await _session(server, f"u{i}") for i in range(4)]
        estimator.culprit = ids[2]
        for i in range(4):
            assert (
                await post_feedback(server, {"feedback_id": f"f{i}", "session_id": f"u{i}", "reward": i})
            ).is_success
            await server.sessions.close(f"u{i}")
        decision = await server.trainer.step()
        assert decision is not None and decision.passed and policy.rows_seen == [3]
        [entry] = [e for e in server.ledger.replay() if e["event"] == "quarantined"]
        assert [(q["rollout_id"], q["reason"]) for q in entry["sessions"]] == [(ids[2], "error")]
        assert "ZeroDivisionError" in entry["sessions"][0]["detail"]
        assert set(ids) <= server.trained and await server.trainer.step(force=True) is None
