"""``agentbolt rollouts list`` shows the question ``rollouts show`` and the trajectory page lead with
(one rule, :func:`agentbolt.runs.answer.task_question`), for any task input."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from agentbolt import types as t
from agentbolt.cli.rollouts import _question
from agentbolt.runs.answer import QUESTION_KEYS, rollout_answer

scalar = st.one_of(
    st.none(), st.text(max_size=12), st.integers(-5, 5), st.floats(allow_nan=False, allow_infinity=False), st.booleans()
)
value = st.one_of(scalar, st.dictionaries(st.text(max_size=3), scalar, max_size=2), st.lists(scalar, max_size=2))
task_input = st.one_of(
    scalar,
    st.dictionaries(st.sampled_from([*QUESTION_KEYS, "answer", "other"]), value, max_size=4),
)


@settings(max_examples=200, deadline=None)
@given(task_input)
def test_the_list_and_the_trajectory_show_the_same_question(value: Any) -> None:
    rollout = t.Rollout(rollout_id="r", task_id="q", input=value, status=t.RolloutStatus.SUCCEEDED)
    shown = rollout_answer(rollout, [], [], None).question
    assert _question(rollout) == " ".join((shown or "").split())
