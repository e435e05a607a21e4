"""Reconciliation: the gateway's calls are the calls; framework LLM spans only name and structure them.

An instrumentation LLM span that joins no gateway call never becomes a call (nor a credit-bearing
step) when the rollout has gateway calls; one that carries a response flags the rollout, which is
then not trained; a streamed call whose request outlives the instrumentation's span joins by the
request fingerprint; both generations of the GenAI conventions are read.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from lrl_traces import Trace

from agentbolt import semconv
from agentbolt.lightningrl import ExclusionReason, LightningRL, extract_episode
from agentbolt.lightningrl.calls import JOIN_WINDOW_S
from agentbolt.lightningrl.spans import agent_name_of, input_messages, is_agent_span
from agentbolt.request_fingerprint import fingerprints
from agentbolt.types import Span, SpanEvent, StatusCode

S = 1_000_000_000  # one second in ns
SYSTEM = {"role": "system", "content": "You are a calculator agent."}
USER = {"role": "user", "content": "What is (2+3)*4?"}


def turn(n: int) -> list[dict[str, Any]]:
    """The messages of the n-th turn of a tool loop (0: system + user)."""
    out: list[dict[str, Any]] = [SYSTEM, USER]
    for i in range(n):
        out.append({"role": "assistant", "content": None, "tool_calls": [{"id": f"c{i}", "type": "function"}]})
        out.append({"role": "tool", "content": str(i * 5), "tool_call_id": f"c{i}"})
    return out


def streamed_rollout(*, phantom: bool = True, t0: int = 1_000 * S) -> tuple[Trace, Span]:
    """A LlamaIndex-style streamed agent: per turn a phantom ``_prepare_chat_with_tools`` LLM
    span, the ``astream_chat`` span that ends before its HTTP request starts, and the gateway
    call whose parent is the agent step (not the instrumentation's span)."""
    tr = Trace()
    agent = tr.agent("calculator")
    for i in range(3):
        step = tr.add(Span.create("run_agent_step", parent_span_id=agent.span_id))
        start = t0 + i * 10 * S
        if phantom:
            tr.framework_llm(
                None, parent=step, name="OpenAI._prepare_chat_with_tools", start_ns=start, end_ns=start + 1
            )
        tr.framework_llm(
            None, parent=step, name="OpenAI.astream_chat", input_messages=turn(i), start_ns=start + 2, end_ns=start + 3
        )
        tr.llm([1, i], [2, i], parent=step, messages=turn(i), start_ns=start + S)  # 1 s after the span ended
    final = tr.final(1.0)
    return tr, final


def test_unjoined_llm_spans_never_become_calls_when_the_rollout_has_gateway_calls() -> None:
    tr, _ = streamed_rollout()
    ep = extract_episode(tr.rollout, tr.spans)
    rec = ep.reconciliation
    assert rec is not None and rec.ok
    assert len(ep.calls) == rec.calls == rec.gateway_calls == 3
    assert all(c.gateway_span is not None and c.trainable for c in ep.calls)
    assert rec.unjoined_llm_spans == 3  # the phantoms: operations, counted
    assert ep.notes["joined_by_fingerprint"] == 3


def test_streamed_span_that_ends_before_its_request_joins_by_fingerprint() -> None:
    tr, _ = streamed_rollout(phantom=False)
    ep = extract_episode(tr.rollout, tr.spans)
    assert [c.framework_spans[0].name for c in ep.calls] == ["OpenAI.astream_chat"] * 3
    for i, call in enumerate(ep.calls):  # each call joined its own turn, not a neighbour's
        assert json.loads(call.framework_spans[0].attributes[semconv.GEN_AI_INPUT_MESSAGES]) == json.loads(
            json.dumps(turn(i))
        )
    assert {c.agent_name for c in ep.calls} == {"calculator"}


def test_fingerprint_join_respects_the_time_window() -> None:
    tr = Trace()
    tr.framework_llm(None, input_messages=turn(0), start_ns=1_000 * S, end_ns=1_000 * S + 1)
    tr.framework_llm(None, name="phantom")  # two anonymous spans for one open call: no order join either
    late = 1_000 * S + int((JOIN_WINDOW_S + 1) * S)
    tr.llm([1], [2], messages=turn(0), start_ns=late)
    tr.final(1.0)
    ep = extract_episode(tr.rollout, tr.spans)
    assert len(ep.calls) == 1 and ep.calls[0].framework_spans == ()
    assert "joined_by_fingerprint" not in ep.notes and ep.reconciliation is not None
    assert ep.reconciliation.unjoined_llm_spans == 2 and ep.reconciliation.ok  # no response: no flag


def test_the_span_that_made_the_request_wins_over_an_earlier_one_with_the_same_messages() -> None:
    tr = Trace()
    t0 = 1_000 * S
    tr.framework_llm(None, name="prepare", input_messages=turn(0), start_ns=t0, end_ns=t0 + 1)
    tr.framework_llm(None, name="astream_chat", input_messages=turn(0), start_ns=t0 + 2, end_ns=t0 + 3)
    tr.llm([1], [2], messages=turn(0), start_ns=t0 + S)
    tr.final(1.0)
    ep = extract_episode(tr.rollout, tr.spans)
    assert [s.name for s in ep.calls[0].framework_spans] == ["astream_chat"]


def test_tail_fingerprint_joins_when_earlier_turns_are_rendered_differently() -> None:
    tr = Trace()
    t0 = 1_000 * S
    rendered = [{"role": "system", "content": "You are a calculator agent. (framework-added note)"}, *turn(1)[1:]]
    tr.framework_llm(None, input_messages=rendered, start_ns=t0, end_ns=t0 + 1)
    tr.llm([1], [2], messages=turn(1), start_ns=t0 + S)
    tr.final(1.0)
    ep = extract_episode(tr.rollout, tr.spans)
    assert len(ep.calls[0].framework_spans) == 1 and ep.notes["joined_by_tail_fingerprint"] == 1


def test_deliberately_broken_join_is_flagged_not_trained() -> None:
    """A framework span with a response whose id no gateway call has, and nothing else linking it:
    a call the gateway never saw (or a broken join). The rollout is flagged and not trained."""
    tr = Trace()
    agent = tr.agent("a")
    tr.llm([1], [2], response_id="r1", parent=agent)
    tr.framework_llm("r1", parent=agent)
    tr.framework_llm("r-broken", parent=agent, output_messages=[{"role": "assistant", "content": "hi"}])
    tr.final(1.0)
    lrl = LightningRL(credit="final", advantage="grpo", allow_empty=True)
    batch = lrl.process([tr.rollout], {tr.rollout.rollout_id: tr.spans})
    assert batch.transitions == []
    (ro,) = batch.report.per_rollout
    assert ro.flag is not None and "bypassed the gateway" in ro.flag and "resources.llm.base_url" in ro.flag
    assert ro.calls == ro.gateway_calls == 1 and ro.unjoined_llm_spans == 1
    assert batch.report.excluded == {ExclusionReason.UNRECONCILED.value: 1}
    assert batch.report.reconciliation == {
        "gateway_calls": 1,
        "calls": 1,
        "unjoined_llm_spans": 1,
        "flagged_rollouts": 1,
    }
    assert "flagged rollout ro-1" in batch.report.summary()
    assert batch.report.metrics()["lightningrl/reconciliation/flagged_rollouts"] == 1.0
    # Opting in trains the calls; the flag is still reported.
    trained = LightningRL(credit="final", advantage="grpo", unreconciled="train").process(
        [tr.rollout], {tr.rollout.rollout_id: tr.spans}
    )
    assert len(trained.transitions) == 1 and trained.report.per_rollout[0].flag is not None


@settings(max_examples=60, deadline=None)
@given(
    turns=st.integers(min_value=1, max_value=6),
    phantoms=st.lists(st.integers(min_value=0, max_value=6), max_size=8),
    rewards=st.lists(st.floats(min_value=-1, max_value=1, allow_nan=False), min_size=6, max_size=6),
    credit=st.sampled_from(["final", "discounted", "intermediate", "air"]),
)
def test_phantom_llm_spans_change_neither_calls_nor_credit(
    turns: int, phantoms: list[int], rewards: list[float], credit: str
) -> None:
    """Invariant: adding response-less framework LLM spans anywhere (phantoms such as LlamaIndex's
    ``_prepare_chat_with_tools``) leaves the calls, their count and every credit mode's rewards unchanged."""

    def build(with_phantoms: bool) -> Trace:
        tr = Trace()
        agent = tr.agent("a")
        for i in range(turns):
            if with_phantoms:
                for _ in range(phantoms.count(i)):
                    tr.framework_llm(None, parent=agent, name="phantom")
            tr.llm([1, i], [2, i], parent=agent, response_id=f"r{i}")
            tr.reward(rewards[i])
        tr.final(1.0)
        return tr

    def run(tr: Trace) -> list[tuple[int, float]]:
        lrl = LightningRL(credit=credit, advantage="grpo", allow_empty=True)
        batch = lrl.collect([tr.rollout], {tr.rollout.rollout_id: tr.spans})
        (ro,) = batch.report.per_rollout
        assert ro.calls == ro.gateway_calls == turns and ro.flag is None
        return [(t.index, t.reward) for t in batch.transitions]

    assert run(build(True)) == run(build(False))


# --- both generations of the GenAI conventions ------------------------------------------------


def test_workflow_spans_of_both_generations_are_agent_spans() -> None:
    old = Span.create(
        "invoke_workflow planner",
        attributes={semconv.GEN_AI_OPERATION_NAME: semconv.OP_INVOKE_WORKFLOW, semconv.GEN_AI_WORKFLOW_NAME: "plan"},
    )
    new = Span.create(
        "invoke_agent planner",
        attributes={semconv.GEN_AI_OPERATION_NAME: semconv.OP_INVOKE_WORKFLOW, semconv.GEN_AI_AGENT_NAME: "plan"},
    )
    bare = Span.create("invoke_workflow plan", attributes={semconv.GEN_AI_OPERATION_NAME: semconv.OP_INVOKE_WORKFLOW})
    assert all(is_agent_span(s) for s in (old, new, bare))
    assert [agent_name_of(s) for s in (old, new, bare)] == ["plan", "plan", "plan"]


def test_legacy_message_events_and_latest_parts_give_the_same_fingerprint() -> None:
    legacy = Span.create(
        "chat m",
        attributes={semconv.GEN_AI_OPERATION_NAME: semconv.OP_CHAT},
        events=[
            SpanEvent(name="gen_ai.system.message", time_ns=0, attributes={"content": SYSTEM["content"]}),
            SpanEvent(name="gen_ai.user.message", time_ns=0, attributes={"content": USER["content"]}),
        ],
    )
    parts = [
        {"role": "system", "parts": [{"type": "text", "content": SYSTEM["content"]}]},
        {"role": "user", "parts": [{"type": "text", "content": USER["content"]}]},
    ]
    latest = Span.create("chat m", attributes={semconv.GEN_AI_INPUT_MESSAGES: json.dumps(parts)})
    assert fingerprints(input_messages(legacy)) == fingerprints(input_messages(latest)) == fingerprints(turn(0))


def test_a_legacy_span_joins_and_its_legacy_usage_is_evidence_of_a_response() -> None:
    tr = Trace()
    t0 = 1_000 * S
    events = [SpanEvent(name="gen_ai.user.message", time_ns=0, attributes={"content": "hi"})]
    tr.add(
        Span.create(
            "chat m",
            attributes={semconv.GEN_AI_OPERATION_NAME: semconv.OP_CHAT},
            events=events,
            start_time_ns=t0,
            end_time_ns=t0 + 1,
        )
    )
    tr.llm([1], [2], messages=[{"role": "user", "content": "hi"}], start_ns=t0 + S)
    tr.add(  # a second old-generation span reporting output tokens: a call the gateway never saw
        Span.create(
            "chat m",
            attributes={semconv.GEN_AI_OPERATION_NAME: semconv.OP_CHAT, semconv.LEGACY_USAGE_OUTPUT_TOKENS: 7},
        )
    )
    tr.final(1.0)
    ep = extract_episode(tr.rollout, tr.spans)
    assert ep.notes["joined_by_fingerprint"] == 1 and len(ep.calls) == 1
    assert ep.reconciliation is not None and ep.reconciliation.unjoined_with_response == 1
    assert ep.calls[0].exclusion == ExclusionReason.UNRECONCILED


# --- the fingerprint join when one rollout sends the same request more than once ---------------


def test_a_retried_request_joins_the_retry_that_answered_not_the_failed_attempt() -> None:
    """A streamed call whose first request fails (a 429) and whose client retries it: two gateway
    calls with the same messages, one framework span. The span (the agent's name, what its
    rewards target) belongs to the retry that answered, the one that trains."""
    tr = Trace()
    t0 = 1_000 * S
    agent = tr.agent("solver")
    tr.framework_llm(None, parent=agent, name="astream_chat", input_messages=turn(0), start_ns=t0, end_ns=t0 + 1)
    tr.llm([1], [2], messages=turn(0), start_ns=t0 + S // 10, error="429 Too Many Requests")  # no traceparent
    tr.llm([1], [3], messages=turn(0), start_ns=t0 + S)
    tr.final(1.0)
    ep = extract_episode(tr.rollout, tr.spans, agent_match="solver")
    failed, retry = ep.calls
    assert failed.gateway_span is not None and failed.gateway_span.status.code == StatusCode.ERROR
    assert failed.framework_spans == () and not failed.trainable
    assert [s.name for s in retry.framework_spans] == ["astream_chat"]
    assert retry.agent_name == "solver" and retry.trainable


def test_the_same_question_sent_concurrently_by_two_agents_keeps_each_agent() -> None:
    """Two agents send identical messages at once (e.g. both start from the task's question);
    the requests reach the gateway in the order the spans started. Each call keeps its agent."""
    tr = Trace()
    t0 = 1_000 * S
    first, second = tr.agent("first"), tr.agent("second")
    tr.framework_llm(None, parent=first, name="first", input_messages=turn(0), start_ns=t0, end_ns=t0 + 1)
    tr.framework_llm(None, parent=second, name="second", input_messages=turn(0), start_ns=t0 + 2, end_ns=t0 + 3)
    tr.llm([1], [2], messages=turn(0), start_ns=t0 + 10)
    tr.llm([1], [3], messages=turn(0), start_ns=t0 + 11)
    tr.final(1.0)
    ep = extract_episode(tr.rollout, tr.spans)
    assert [c.agent_name for c in ep.calls] == ["first", "second"]


@settings(max_examples=80, deadline=None)
@given(
    calls=st.lists(
        st.tuples(st.booleans(), st.booleans(), st.integers(min_value=1, max_value=3_000)), min_size=1, max_size=6
    ),
    concurrent=st.booleans(),
)
def test_identical_requests_each_join_the_span_that_made_them(
    calls: list[tuple[bool, bool, int]], concurrent: bool
) -> None:
    """Invariant: when a rollout sends the same messages several times (repeated questions,
    client retries, a preparing phantom span with the same messages), and requests reach the
    gateway in the order their spans started, every answered gateway call joins the framework
    span that made it, and no span with a response is left unjoined (no flag)."""
    ms = 1_000_000
    tr = Trace()
    t = 1_000 * S
    spans: list[tuple[int, str]] = []  # (start, name) of each call's own framework span
    requests: list[tuple[int, bool, str | None]] = []  # (start, failed, name of the span it belongs to)
    for i, (phantom, retried, delay_ms) in enumerate(calls):
        if phantom and not concurrent:
            tr.framework_llm(None, name=f"phantom{i}", input_messages=turn(0), start_ns=t, end_ns=t + ms)
            t += 2 * ms
        name = f"call{i}"
        tr.framework_llm(
            None, name=name, input_messages=turn(0), start_ns=t, end_ns=t + ms,
            output_messages=[{"role": "assistant", "content": str(i)}],
        )  # fmt: skip
        spans.append((t, name))
        if concurrent:
            t += 2 * ms
            continue
        if retried:
            requests.append((t + 2 * ms, True, None))
        requests.append((t + (3 + delay_ms) * ms, False, name))
        t += (4 + delay_ms) * ms
    if concurrent:  # every span first, then the requests in the same order (retries before them)
        for _, retried, _ in calls:
            if retried:
                requests.append((t, True, None))
                t += ms
        for _, name in spans:
            requests.append((t, False, name))
            t += ms
    expected = {}
    for start, failed, name in requests:
        g = tr.llm([1], [2], messages=turn(0), start_ns=start, error="503" if failed else None)
        expected[g.span_id] = name
    tr.final(1.0)
    ep = extract_episode(tr.rollout, tr.spans)
    assert ep.reconciliation is not None and ep.reconciliation.flag is None
    answered = [c for c in ep.calls if c.gateway_span is not None and expected[c.gateway_span.span_id] is not None]
    assert len(answered) == len(calls)
    for call in answered:
        assert call.gateway_span is not None
        assert [s.name for s in call.framework_spans] == [expected[call.gateway_span.span_id]]
