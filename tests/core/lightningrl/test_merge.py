"""Trajectory merging: exact token-prefix extensions become one masked sequence."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from agentbolt.lightningrl import merge_transitions
from agentbolt.types import Transition


def tr(
    prompt: list[int],
    response: list[int],
    *,
    index: int,
    rollout: str = "r",
    agent: str | None = "a",
    reward: float = 1.0,
    advantage: float = 0.5,
) -> Transition:
    return Transition(
        rollout_id=rollout,
        index=index,
        agent_name=agent,
        prompt_ids=prompt,
        response_ids=response,
        response_logprobs=[-0.1 * (k + 1) for k in range(len(response))],
        reward=reward,
        advantage=advantage,
        span_id=f"{index:016x}",
    )


def test_prefix_extension_merges_with_masked_observation() -> None:
    a = tr([1, 2], [3, 4], index=0)
    b = tr([1, 2, 3, 4, 90, 91], [5], index=1)  # 90, 91: tool output inserted between calls
    c = tr([1, 2, 3, 4, 90, 91, 5, 92], [6, 7], index=2)
    res = merge_transitions([a, b, c])
    assert res.stats == {"input": 3, "merged": 2, "output": 1}
    (m,) = res.transitions
    assert m.prompt_ids == [1, 2]
    assert m.response_ids == [3, 4, 90, 91, 5, 92, 6, 7]
    assert m.response_mask == [1, 1, 0, 0, 1, 0, 1, 1]
    assert m.response_logprobs == [-0.1, -0.2, 0.0, 0.0, -0.1, 0.0, -0.1, -0.2]
    assert m.metadata["merged_indices"] == [0, 1, 2]
    assert m.metadata["merged_span_ids"] == [a.span_id, b.span_id, c.span_id]
    assert m.reward == 1.0 and m.advantage == 0.5 and m.index == 0


def test_no_merge_when_not_a_prefix_or_credit_differs() -> None:
    a = tr([1, 2], [3], index=0)
    rerendered = tr([1, 9, 3, 4], [5], index=1)  # chat template re-rendered the history
    other_credit = tr([1, 9, 3, 4, 5, 6], [7], index=2, advantage=-1.0)
    res = merge_transitions([a, rerendered, other_credit])
    assert len(res.transitions) == 3
    assert res.stats["not_prefix"] == 1 and res.stats["credit_differs"] == 1


def test_streams_are_per_rollout_and_agent_and_bounded_by_max_length() -> None:
    a = tr([1], [2], index=0, agent="x")
    other_agent = tr([1, 2, 3], [4], index=1, agent="y")
    b = tr([1, 2, 3], [4], index=2, agent="x")
    other_rollout = tr([1], [2], index=0, rollout="s", agent="x")
    res = merge_transitions([a, other_agent, b, other_rollout])
    assert [(t.rollout_id, t.index) for t in res.transitions] == [("r", 0), ("r", 1), ("s", 0)]
    assert res.transitions[0].response_ids == [2, 3, 4]
    bounded = merge_transitions([a, b], max_length=3)
    assert len(bounded.transitions) == 2 and bounded.stats["over_length"] == 1


@st.composite
def conversations(draw: st.DrawFn) -> list[Transition]:
    """A rollout's calls: usually each prompt extends the previous context, sometimes not."""
    out: list[Transition] = []
    context: list[int] = draw(st.lists(st.integers(0, 50), min_size=1, max_size=5))
    for i in range(draw(st.integers(1, 6))):
        if out and draw(st.booleans()):
            context = [*context, *draw(st.lists(st.integers(0, 50), max_size=3))]  # extension
        elif out:
            context = draw(st.lists(st.integers(0, 50), min_size=1, max_size=8))  # restart
        response = draw(st.lists(st.integers(100, 150), min_size=1, max_size=4))
        agent = draw(st.sampled_from(["a", "b"]))
        out.append(tr(context, response, index=i, agent=agent, advantage=draw(st.sampled_from([0.5, 0.5, 1.0]))))
        context = [*context, *response]
    return out


@given(conversations())
def test_merging_never_changes_the_token_stream(calls: list[Transition]) -> None:
    res = merge_transitions(calls)
    assert res.stats["output"] + res.stats.get("merged", 0) == len(calls)
    by_index = {t.index: t for t in calls}
    for m in res.transitions:
        members = [by_index[i] for i in m.metadata.get("merged_indices", [m.index])]  # type: ignore[union-attr]
        last = members[-1]
        # the merged sequence is exactly the last call's prompt + response...
        assert m.prompt_ids + m.response_ids == last.prompt_ids + last.response_ids
        # ...whose trainable tokens are exactly the calls' own responses, in order, with their logprobs
        mask = m.response_mask or [1] * len(m.response_ids)
        assert [x for x, k in zip(m.response_ids, mask, strict=True) if k] == [
            x for c in members for x in c.response_ids
        ]
        lp = m.response_logprobs or []
        assert [x for x, k in zip(lp, mask, strict=True) if k] == [
            x for c in members for x in c.response_logprobs or []
        ]
        assert all(x == 0.0 for x, k in zip(lp, mask, strict=True) if not k)
        assert len({(c.agent_name, c.advantage) for c in members}) == 1
