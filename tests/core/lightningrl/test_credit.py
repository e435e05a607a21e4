"""Credit assigners (final, discounted, intermediate, AIR) on traces with known answers."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from lrl_traces import Trace

from agentbolt.errors import UserError
from agentbolt.lightningrl import (
    AIRCredit,
    AIRRule,
    AIRSignal,
    DiscountedCredit,
    Episode,
    ExceptionRule,
    FinalCredit,
    FormatRule,
    IntermediateCredit,
    discounted_returns,
    extract_episode,
    get_credit_assigner,
)
from agentbolt.plugins import Plugins


def _three_calls(final: float | None = 1.0) -> Episode:
    tr = Trace()
    tr.llm([1], [2])
    tr.reward(0.5)
    tr.llm([3], [4])
    tr.llm([5], [6])
    tr.reward(-0.25)
    if final is not None:
        tr.final(final)
    return extract_episode(tr.rollout, tr.spans, promote_trailing_reward=False)


def test_final_broadcasts_the_episode_return() -> None:
    credit = FinalCredit().assign(_three_calls())
    assert credit is not None and credit.rewards == (1.0, 1.0, 1.0)


def test_discounted_return_to_go() -> None:
    ep = _three_calls()  # r = (0.5, 0, -0.25), R = 1 at the last call
    credit = DiscountedCredit(gamma=0.5).assign(ep)
    assert credit is not None
    # G2 = -0.25 + 1 = 0.75; G1 = 0 + 0.5*0.75 = 0.375; G0 = 0.5 + 0.5*0.375 = 0.6875
    assert credit.rewards == pytest.approx((0.6875, 0.375, 0.75))
    only_final = DiscountedCredit(gamma=0.5, include_intermediate=False).assign(ep)
    assert only_final is not None and only_final.rewards == pytest.approx((0.25, 0.5, 1.0))
    undiscounted = DiscountedCredit(gamma=1.0).assign(ep)
    assert undiscounted is not None and undiscounted.rewards == pytest.approx((1.25, 0.75, 0.75))


def test_intermediate_adds_per_call_rewards_to_the_return() -> None:
    credit = IntermediateCredit().assign(_three_calls())
    assert credit is not None and credit.rewards == (1.5, 1.0, 0.75)
    weighted = IntermediateCredit(final_weight=0.5, intermediate_weight=2.0).assign(_three_calls())
    assert weighted is not None and weighted.rewards == (1.5, 0.5, 0.0)
    assert weighted.components[0] == {"final": 0.5, "intermediate": 1.0}


@pytest.mark.parametrize("assigner", [FinalCredit(), DiscountedCredit(), IntermediateCredit(), AIRCredit()])
def test_missing_return_gives_no_credit(assigner: object) -> None:
    assert assigner.assign(_three_calls(final=None)) is None  # type: ignore[attr-defined]


def test_credit_spans_every_call_including_untrained_agents() -> None:
    """A discounted return counts the steps of untrained agents too."""
    tr = Trace()
    tr.llm([1], [2], agent_name="trained")
    tr.llm([3], [4], agent_name="frozen")
    tr.final(1.0)
    ep = extract_episode(tr.rollout, tr.spans, agent_match=["trained"])
    credit = DiscountedCredit(gamma=0.5).assign(ep)
    assert credit is not None and credit.rewards == (0.5, 1.0)


@given(
    st.lists(st.floats(-10, 10), min_size=1, max_size=8),
    st.floats(-10, 10),
    st.floats(0, 1),
)
def test_discounted_returns_satisfy_the_bellman_recursion(steps: list[float], final: float, gamma: float) -> None:
    g = discounted_returns(steps, final, gamma)
    assert g[-1] == pytest.approx(steps[-1] + final)
    for i in range(len(steps) - 1):
        assert g[i] == pytest.approx(steps[i] + gamma * g[i + 1], abs=1e-9)


def test_gamma_is_validated() -> None:
    with pytest.raises(UserError, match="gamma"):
        DiscountedCredit(gamma=1.5)


# --- AIR ---------------------------------------------------------------------------------------


def test_air_penalises_the_call_that_issued_the_failed_tool_call() -> None:
    tr = Trace()
    tr.llm([1], [2], tool_calls=["call_a", "call_b"], text=None)  # call 0 asks for two tools
    tr.llm([3], [4])  # call 1 recorded before the tool spans were exported
    tr.tool("search", call_id="call_a", error=True)
    tr.tool("lookup", call_id="call_b")  # success
    tr.final(1.0)
    credit = AIRCredit(tool_error=-0.5).assign(extract_episode(tr.rollout, tr.spans))
    assert credit is not None
    assert credit.rewards == (0.5, 1.0), "matched by tool call id, not by seq order"
    assert credit.components[0] == {"final": 1.0, "air.tool_error": -0.5}
    assert credit.notes == {"air.tool_error.tool_call_id": 1}


def test_air_tool_success_bonus_and_fallback_to_preceding_call() -> None:
    tr = Trace()
    tr.llm([1], [2])
    tr.tool("search", error=True)  # no call id recorded
    tr.llm([3], [4])
    tr.tool("search")
    tr.final(0.0)
    ep = extract_episode(tr.rollout, tr.spans)
    credit = AIRCredit(tool_error=-1.0, tool_success=0.25).assign(ep)
    assert credit is not None and credit.rewards == (-1.0, 0.25)
    assert credit.notes == {"air.tool_error.preceding": 1, "air.tool_success.preceding": 1}
    strict = AIRCredit(tool_fallback="none").assign(ep)
    assert strict is not None and strict.rewards == (0.0, 0.0)
    assert strict.notes == {"air.tool_error.unmatched": 1}


def test_air_exceptions_count_once_per_call_and_not_twice_with_tool_errors() -> None:
    tr = Trace()
    agent = tr.agent("a")
    tr.llm([1], [2], tool_calls=["c1"])
    tr.tool("t", call_id="c1", error=True, parent=agent, exc=("KeyError", "k"))
    tr.llm([3], [4])
    tr.exception("ValueError", "parse failed", parent=agent)
    tr.exception("ValueError", "parse failed")  # the same exception recorded again by the runner
    tr.exception("KeyError", "k")  # propagated tool error: the tool rule already counted it
    tr.final(1.0)
    ep = extract_episode(tr.rollout, tr.spans)
    credit = AIRCredit(tool_error=-1.0, exception=-0.5).assign(ep)
    assert credit is not None and credit.rewards == (0.0, 0.5)
    no_tool_rule = AIRCredit(tool_error=0.0, exception=-0.5).assign(ep)
    # the tool span now counts as the KeyError exception (on call 0); its terminal record does not
    assert no_tool_rule is not None and no_tool_rule.rewards == (0.5, 0.5)


def test_air_counts_the_same_error_raised_again_at_a_later_step() -> None:
    tr = Trace()
    agent = tr.agent("a")
    tr.llm([1], [2])
    tr.exception("ValueError", "could not parse", parent=agent)  # caught, the agent retries
    tr.llm([3], [4])
    tr.exception("ValueError", "could not parse", parent=agent)  # a new failure, not propagation
    tr.llm([5], [6])
    tr.final(1.0)
    credit = AIRCredit(exception=-1.0).assign(extract_episode(tr.rollout, tr.spans))
    assert credit is not None and credit.rewards == (0.0, 0.0, 1.0)


def test_air_exception_inside_an_llm_call_span_attaches_to_that_call() -> None:
    tr = Trace()
    tr.llm([1], [2], response_id="r1")
    fw = tr.framework_llm("r1")
    tr.llm([3], [4])
    tr.exception("OutputParserError", "bad json", parent=fw)
    tr.final(0.0)
    credit = AIRCredit().assign(extract_episode(tr.rollout, tr.spans))
    assert credit is not None and credit.rewards == (-1.0, 0.0)
    assert credit.notes == {"air.exception.enclosing": 1}


def test_air_format_check_and_truncation() -> None:
    tr = Trace()
    tr.llm([1], [2], text="<answer>42</answer>", agent_name="solver")
    tr.llm([3], [4], text="I think 42", agent_name="solver")
    tr.llm([5], [6], text="free text", agent_name="chatter")
    tr.llm([7], [8], text=None, tool_calls=["x"], agent_name="solver")  # tool calls are not checked
    tr.llm([9], [10], text="<answer>", finish="length", agent_name="solver")
    tr.final(1.0)
    ep = extract_episode(tr.rollout, tr.spans)
    air = AIRCredit(
        format_pattern=r"<answer>.*</answer>", format_penalty=-1.0, format_agents=["solver"], truncation=-0.5
    )
    credit = air.assign(ep)
    assert credit is not None
    assert credit.rewards == (1.0, 0.0, 1.0, 1.0, -0.5)
    assert credit.components[4] == {"final": 1.0, "air.format": -1.0, "air.finish_length": -0.5}


def test_air_format_reads_adapter_output_messages_without_gateway_body() -> None:
    tr = Trace()
    tr.llm([1], [2], response_id="r1", text=None)
    # strip the gateway's response body: only the adapter recorded the text
    tr.spans[-1] = tr.spans[-1].model_copy(
        update={"attributes": {k: v for k, v in tr.spans[-1].attributes.items() if k != "agentbolt.llm.response"}}
    )
    tr.framework_llm("r1", output_messages=[{"role": "assistant", "parts": [{"type": "text", "content": "DONE"}]}])
    tr.final(0.0)
    ep = extract_episode(tr.rollout, tr.spans)
    assert ep.calls[0].response_text == "DONE"
    credit = AIRCredit(format_pattern="^DONE$", format_bonus=0.5, format_penalty=-1.0).assign(ep)
    assert credit is not None and credit.rewards == (0.5,)


def test_air_discounted_aggregate_and_emitted_rewards() -> None:
    tr = Trace()
    tr.llm([1], [2])
    tr.tool("t", error=True)
    tr.reward(0.5)
    tr.llm([3], [4])
    tr.final(1.0)
    ep = extract_episode(tr.rollout, tr.spans)
    # steps: call0 = 0.5 emitted - 1 tool = -0.5; call1 = 0; R = 1
    credit = AIRCredit(aggregate="discounted", gamma=0.5).assign(ep)
    assert credit is not None and credit.rewards == pytest.approx((-0.5 + 0.5 * 1.0, 1.0))
    no_emitted = AIRCredit(include_emitted=False).assign(ep)
    assert no_emitted is not None and no_emitted.rewards == (0.0, 1.0)


def test_air_custom_rules() -> None:
    class LongResponse(AIRRule):
        def signals(self, episode: Episode) -> list[AIRSignal]:
            return [
                AIRSignal("long", -0.1 * len(c.response_ids or []), c.index, "call")
                for c in episode.calls
                if len(c.response_ids or []) > 2
            ]

    tr = Trace()
    tr.llm([1], [2, 3, 4])
    tr.llm([1], [2])
    tr.final(1.0)
    credit = AIRCredit(rules=[LongResponse(), FormatRule("ok")]).assign(extract_episode(tr.rollout, tr.spans))
    assert credit is not None and credit.rewards == pytest.approx((0.7, 1.0))
    with pytest.raises(UserError, match="AIRRule"):
        AIRCredit(rules=["nope"])  # type: ignore[list-item]
    assert isinstance(AIRCredit(exception=-2.0).rules[1], ExceptionRule)


# --- registry ----------------------------------------------------------------------------------


def test_registry_lookups_build_configured_instances() -> None:
    plugins = Plugins(load_entry_points=False)
    assert plugins.credit_assigners.names() == ["air", "discounted", "final", "intermediate"]
    assert plugins.advantage_estimators.names() == ["grpo", "reinforce_pp", "rloo"]
    discounted = get_credit_assigner("discounted", plugins=plugins, gamma=0.9)
    assert isinstance(discounted, DiscountedCredit) and discounted.gamma == 0.9
    with pytest.raises(UserError, match="valid names: air, discounted, final, intermediate"):
        get_credit_assigner("finl", plugins=plugins)
    with pytest.raises(UserError, match="does not accept options"):
        get_credit_assigner("final", plugins=plugins, gamma=0.9)


def test_plugins_can_register_their_own_assigner() -> None:
    from agentbolt import hookimpl

    class Halved(FinalCredit):
        name = "halved"

        def assign(self, episode: Episode):  # type: ignore[override]
            base = super().assign(episode)
            return None if base is None else type(base)(rewards=tuple(r / 2 for r in base.rewards))

    class Plugin:
        @hookimpl
        def agentbolt_register_credit(self, register):  # type: ignore[no-untyped-def]
            register("halved", Halved)

    plugins = Plugins(load_entry_points=False)
    plugins.register(Plugin(), name="halver")
    credit = get_credit_assigner("halved", plugins=plugins).assign(_three_calls())
    assert credit is not None and credit.rewards == (0.5, 0.5, 0.5)
