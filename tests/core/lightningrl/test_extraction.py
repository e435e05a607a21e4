"""Extraction: spans of a rollout's final attempt → calls, agent names, exclusions, rewards."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lrl_traces import Trace

from agentbolt.errors import UserError
from agentbolt.lightningrl import ExclusionReason, extract_episode
from agentbolt.types import Span, TokenSource

X = ExclusionReason


def test_single_agent_calls_in_seq_order_with_token_data() -> None:
    tr = Trace()
    a = tr.llm([1, 2], [3, 4], logprobs=[-0.1, -0.2], version=7, finish="stop")
    b = tr.llm([1, 2, 3, 4, 5], [6], finish="length")
    tr.final(1.0)
    shuffled = list(reversed(tr.spans))  # input order must not matter: seq decides
    ep = extract_episode(tr.rollout, shuffled)
    assert [c.span_id for c in ep.calls] == [a.span_id, b.span_id]
    first, second = ep.calls
    assert first.prompt_ids == [1, 2] and first.response_ids == [3, 4]
    assert first.response_logprobs == [-0.1, -0.2]
    assert first.policy_version == 7 and first.token_source == TokenSource.EXACT
    assert second.finish_reason == "length" and second.index == 1
    assert ep.final_reward == 1.0 and ep.final_source == "span"
    assert all(c.trainable for c in ep.calls)


def test_adapter_span_joins_gateway_span_by_response_id_and_names_the_agent() -> None:
    tr = Trace()
    agent = tr.agent("planner")
    gw = tr.llm([1], [2], response_id="resp-A")
    fw = tr.framework_llm("resp-A", parent=agent)  # exported after the gateway span
    tr.final(1.0)
    ep = extract_episode(tr.rollout, tr.spans)
    assert len(ep.calls) == 1, "the adapter span and the gateway span are one call"
    call = ep.calls[0]
    assert call.trainable and call.agent_name == "planner"
    assert call.span_id == gw.span_id and call.framework_spans == (fw,)
    assert ep.notes["joined_by_response_id"] == 1


def test_nearest_enclosing_agent_wins_and_kind_attr_agents_count() -> None:
    tr = Trace()
    outer = tr.agent("team")
    inner = tr.agent("coder", parent=outer, kind_attr=True)
    node = tr.add(Span.create("some chain", parent_span_id=inner.span_id))
    tr.llm([1], [2], response_id="r1")
    tr.framework_llm("r1", parent=node)
    tr.final(0.0)
    ep = extract_episode(tr.rollout, tr.spans)
    assert ep.calls[0].agent_name == "coder"


def test_agent_name_from_the_calls_own_attribute_without_agent_spans() -> None:
    tr = Trace()
    tr.llm([1], [2], agent_name="solo")
    tr.final(1.0)
    assert extract_episode(tr.rollout, tr.spans).calls[0].agent_name == "solo"


def test_gateway_joined_by_traceparent_parentage() -> None:
    tr = Trace()
    agent = tr.agent("writer")
    fw = tr.framework_llm(None, parent=agent)  # instrumentation did not record the response id
    tr.llm([1], [2], parent=fw)  # client propagated traceparent to the gateway
    tr.final(1.0)
    ep = extract_episode(tr.rollout, tr.spans)
    assert len(ep.calls) == 1 and ep.calls[0].agent_name == "writer" and ep.calls[0].trainable
    assert ep.notes["joined_by_parent"] == 1


def test_nested_framework_llm_spans_are_one_call() -> None:
    tr = Trace()
    outer = tr.framework_llm("r1", name="ChatOpenAI")
    tr.framework_llm("r1", parent=outer, name="openai.chat")
    tr.llm([1], [2], response_id="r1")
    tr.final(1.0)
    ep = extract_episode(tr.rollout, tr.spans)
    assert len(ep.calls) == 1 and len(ep.calls[0].framework_spans) == 2


def test_adapter_span_without_gateway_counterpart_is_no_call_and_flags_the_rollout() -> None:
    tr = Trace()
    agent = tr.agent("a")
    tr.llm([1], [2], response_id="r1")
    tr.framework_llm("r1", parent=agent)
    tr.framework_llm("r-elsewhere", parent=agent)  # e.g. called a non-gateway endpoint
    tr.final(1.0)
    ep = extract_episode(tr.rollout, tr.spans)
    assert len(ep.calls) == 1  # the gateway's calls are the calls
    assert ep.reconciliation is not None and ep.reconciliation.unjoined_llm_spans == 1
    assert ep.reconciliation.flag is not None and "bypassed the gateway" in ep.reconciliation.flag
    assert ep.calls[0].exclusion == X.UNRECONCILED


def test_adapter_spans_without_any_gateway_call_are_calls_without_token_ids() -> None:
    """The backend is not fronted (no gateway call at all): the ids-less path of before."""
    tr = Trace()
    agent = tr.agent("a")
    orphan = tr.framework_llm("r-elsewhere", parent=agent)
    tr.final(1.0)
    ep = extract_episode(tr.rollout, tr.spans)
    assert len(ep.calls) == 1
    missing = ep.calls[0]
    assert missing.exclusion == X.NO_TOKEN_IDS and missing.span_id == orphan.span_id
    assert missing.agent_name == "a" and "no gateway span" in (missing.exclusion_detail or "")
    assert ep.reconciliation is not None and ep.reconciliation.ok and ep.reconciliation.gateway_calls == 0


def test_duplicate_response_ids_pair_in_order() -> None:
    """A backend that always returns the same id must not collapse distinct calls."""
    tr = Trace()
    tr.llm([1], [2], response_id="same")
    tr.framework_llm("same")
    tr.llm([1, 2, 3], [4], response_id="same")
    tr.framework_llm("same")
    tr.final(1.0)
    ep = extract_episode(tr.rollout, tr.spans)
    assert len(ep.calls) == 2 and all(c.trainable for c in ep.calls)
    assert [len(c.framework_spans) for c in ep.calls] == [1, 1]


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"source": "missing"}, X.NO_TOKEN_IDS),
        ({"source": "retokenized"}, X.RETOKENIZED),
        ({"error": "upstream 500"}, X.FAILED_CALL),
        ({"logprobs": [-1.0, -1.0, -1.0]}, X.MALFORMED),
    ],
)
def test_exclusion_reasons(kwargs: dict[str, object], reason: ExclusionReason) -> None:
    tr = Trace()
    tr.llm([1, 2], [3, 4], **kwargs)  # type: ignore[arg-type]
    tr.final(1.0)
    call = extract_episode(tr.rollout, tr.spans).calls[0]
    assert call.exclusion == reason and not call.trainable


def test_empty_response_and_retokenized_allowed() -> None:
    tr = Trace()
    tr.llm([1], [], logprobs=[])
    tr.llm([1], [2], source="retokenized")
    tr.final(1.0)
    ep = extract_episode(tr.rollout, tr.spans, allow_retokenized=True)
    assert ep.calls[0].exclusion == X.EMPTY_RESPONSE
    assert ep.calls[1].trainable and ep.calls[1].token_source == TokenSource.RETOKENIZED


def test_over_length_limits() -> None:
    tr = Trace()
    tr.llm([1, 2, 3], [4])  # prompt 3
    tr.llm([1], [2, 3, 4])  # response 3
    tr.llm([1, 2], [3, 4])  # total 4
    tr.llm([1], [2])
    tr.final(1.0)
    ep = extract_episode(tr.rollout, tr.spans, max_prompt_length=2, max_response_length=2, max_length=3)
    assert [c.exclusion for c in ep.calls] == [X.OVER_LENGTH, X.OVER_LENGTH, X.OVER_LENGTH, None]
    assert "max_prompt_length" in (ep.calls[0].exclusion_detail or "")
    assert "max_length" in (ep.calls[2].exclusion_detail or "")


def test_agent_match_regex_list_and_predicate() -> None:
    tr = Trace()
    for name in ("write_query", "check_query", "rewrite_query"):
        tr.llm([1], [2], agent_name=name)
    tr.llm([1], [2])  # no agent name
    tr.final(1.0)

    def selected(match: object) -> list[bool]:
        return [c.trainable for c in extract_episode(tr.rollout, tr.spans, agent_match=match).calls]  # type: ignore[arg-type]

    assert selected(None) == [True, True, True, True]
    assert selected("write") == [True, False, True, False]  # regex search, as in Agent Lightning
    assert selected(r"^write_query$") == [True, False, False, False]
    assert selected(["check_query"]) == [False, True, False, False]
    assert selected(lambda n: n is None) == [False, False, False, True]
    ep = extract_episode(tr.rollout, tr.spans, agent_match="write")
    assert ep.calls[1].exclusion == X.AGENT_NOT_SELECTED
    with pytest.raises(UserError, match="regular expression"):
        extract_episode(tr.rollout, tr.spans, agent_match="(")


def test_agent_not_selected_takes_precedence_over_token_problems() -> None:
    tr = Trace()
    tr.llm([1], [2], source="missing", agent_name="other")
    tr.final(1.0)
    assert extract_episode(tr.rollout, tr.spans, agent_match=["mine"]).calls[0].exclusion == X.AGENT_NOT_SELECTED


def test_only_the_final_attempt_is_used() -> None:
    tr = Trace(attempt_id="at-old")
    tr.llm([9], [9])
    tr.reward(5.0, final=True)
    tr.attempt_id = tr.rollout.current_attempt_id  # the retry
    new = tr.llm([1], [2])
    tr.final(1.0)  # runner's final reward carries no attempt id
    ep = extract_episode(tr.rollout, tr.spans)
    assert [c.span_id for c in ep.calls] == [new.span_id]
    assert ep.final_reward == 1.0
    assert ep.notes["spans_other_attempts"] == 2


def test_latest_attempt_inferred_when_rollout_has_none() -> None:
    tr = Trace(attempt_id="at-1", current_attempt_id=None)
    tr.llm([9], [9])
    tr.attempt_id = "at-2"
    tr.llm([1], [2])
    ep = extract_episode(tr.rollout, tr.spans)
    assert ep.attempt_id == "at-2" and len(ep.calls) == 1


def test_unsequenced_spans_keep_the_given_order() -> None:
    tr = Trace()
    tr.llm([1], [2])
    tr.llm([3], [4])
    spans = [s.model_copy(update={"seq": None}) for s in tr.spans]
    ep = extract_episode(tr.rollout, spans)
    assert [c.prompt_ids for c in ep.calls] == [[1], [3]]
    assert ep.notes["unsequenced_spans"] == 2


# --- rewards ----------------------------------------------------------------------------------


def test_intermediate_reward_attaches_to_the_preceding_call() -> None:
    tr = Trace()
    tr.llm([1], [2])
    tr.reward(0.25)
    tr.llm([3], [4])
    tr.llm([5], [6])
    tr.reward(0.5)
    tr.reward(0.125)  # two rewards on one call add up
    tr.final(1.0)
    ep = extract_episode(tr.rollout, tr.spans)
    assert ep.step_rewards == (0.25, 0.0, 0.625)
    assert [r.attachment for r in ep.rewards] == ["preceding", "preceding", "preceding", "final"]


def test_explicit_targets_override_seq_order() -> None:
    tr = Trace()
    first = tr.llm([1], [2], response_id="resp-1")
    tr.llm([3], [4], response_id="resp-2")
    tr.reward(1.0, target_span=first)
    tr.reward(2.0, target_response="resp-1")
    tr.reward(4.0, target_response="nope")
    tr.reward(8.0, target_span="0123456789abcdef")
    tr.final(0.0)
    ep = extract_episode(tr.rollout, tr.spans)
    assert ep.step_rewards == (3.0, 0.0), "unknown targets are never moved to another call"
    atts = [r.attachment for r in ep.rewards]
    assert atts == ["target_span", "target_response", "unattached", "unattached", "final"]
    assert ep.notes["rewards_unattached"] == 2


def test_target_span_may_be_the_joined_adapter_span() -> None:
    tr = Trace()
    tr.llm([1], [2], response_id="r1")
    fw = tr.framework_llm("r1")
    tr.llm([3], [4])
    tr.reward(1.0, target_span=fw)
    tr.final(0.0)
    assert extract_episode(tr.rollout, tr.spans).step_rewards == (1.0, 0.0)


def test_reward_before_any_call_is_unattached() -> None:
    tr = Trace()
    tr.reward(1.0)
    tr.llm([1], [2])
    tr.final(0.0)
    ep = extract_episode(tr.rollout, tr.spans)
    assert ep.rewards[0].attachment == "unattached" and ep.step_rewards == (0.0,)


def test_last_final_reward_wins() -> None:
    tr = Trace()
    tr.llm([1], [2])
    tr.reward(0.3, final=True)
    tr.final(0.7)
    ep = extract_episode(tr.rollout, tr.spans)
    assert ep.final_reward == 0.7 and ep.notes["final_rewards_superseded"] == 1


def test_rollout_final_reward_is_the_fallback() -> None:
    tr = Trace(final_reward=0.4)
    tr.llm([1], [2])
    ep = extract_episode(tr.rollout, tr.spans)
    assert (ep.final_reward, ep.final_source) == (0.4, "rollout")


def test_trailing_reward_is_promoted_only_when_asked() -> None:
    tr = Trace()
    tr.llm([1], [2])
    tr.reward(0.5)  # intermediate on call 0
    tr.llm([3], [4])
    tr.reward(0.9)  # emitted after the last call, agent returned None
    ep = extract_episode(tr.rollout, tr.spans)
    assert (ep.final_reward, ep.final_source) == (0.9, "trailing_reward")
    assert ep.step_rewards == (0.5, 0.0), "the promoted reward is not also counted as intermediate"
    off = extract_episode(tr.rollout, tr.spans, promote_trailing_reward=False)
    assert off.final_reward is None and off.step_rewards == (0.5, 0.9)


def test_no_reward_at_all_is_missing() -> None:
    tr = Trace()
    tr.llm([1], [2])
    ep = extract_episode(tr.rollout, tr.spans)
    assert ep.final_reward is None and ep.final_source is None


def test_malformed_and_dimension_rewards() -> None:
    tr = Trace()
    tr.llm([1], [2])
    tr.reward(None)  # no value
    tr.reward(None, dimensions={"acc": 0.75, "len": -0.1}, primary="acc")
    tr.reward(float("nan"), final=True)
    tr.final(1.0)
    ep = extract_episode(tr.rollout, tr.spans)
    assert [r.attachment for r in ep.rewards] == ["malformed", "preceding", "malformed", "final"]
    assert ep.step_rewards == (0.75,)
    assert ep.rewards[1].dimensions == {"acc": 0.75, "len": -0.1}
    assert ep.notes["rewards_malformed"] == 2


@settings(max_examples=30, deadline=None)
@given(st.randoms(use_true_random=False), st.integers(1, 6))
def test_extraction_does_not_depend_on_input_order(rnd: random.Random, n: int) -> None:
    tr = Trace()
    agent = tr.agent("a")
    for i in range(n):
        tr.llm([i], [i + 1], response_id=f"r{i}")
        tr.framework_llm(f"r{i}", parent=agent)
        if i % 2:
            tr.reward(float(i))
    tr.final(1.0)
    shuffled = list(tr.spans)
    rnd.shuffle(shuffled)
    a, b = extract_episode(tr.rollout, tr.spans), extract_episode(tr.rollout, shuffled)
    assert [c.span_ids for c in a.calls] == [c.span_ids for c in b.calls]
    assert a.step_rewards == b.step_rewards and a.final_reward == b.final_reward
    assert len(a.calls) == n


def test_spans_without_response_ids_join_by_order() -> None:
    # Streamed calls through some clients leave the framework's LLM span without a response id:
    # with as many such spans as unjoined gateway calls, they pair in order (and say so).
    tr = Trace()
    writer = tr.agent("writer")
    tr.framework_llm(None, parent=writer)
    tr.llm([1, 2], [3])
    checker = tr.agent("checker")
    tr.framework_llm(None, parent=checker)
    tr.llm([1, 2, 3, 4], [5])
    ep = extract_episode(tr.rollout, tr.spans)
    assert [c.agent_name for c in ep.calls] == ["writer", "checker"]
    assert ep.notes["joined_by_order"] == 2


def test_order_join_refuses_ambiguous_counts() -> None:
    tr = Trace()
    writer = tr.agent("writer")
    tr.framework_llm(None, parent=writer)
    tr.llm([1, 2], [3])
    tr.llm([1, 2, 3, 4], [5])  # two gateway calls, one anonymous framework span: no guessing
    ep = extract_episode(tr.rollout, tr.spans)
    assert "joined_by_order" not in ep.notes
    assert ep.notes["unjoined_without_response_id"] == 1
