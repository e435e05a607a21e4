"""LightningRL per policy (agentbolt.policies.PolicyLightningRL): each policy's rows come from its own
agents' calls, with its own config; calls of no policy and calls served by another policy are
left out with their reasons."""

from __future__ import annotations

import re

import pytest
from lrl_traces import Trace

from agentbolt.lightningrl import EmptyBatchError, LightningRL, LightningRLConfig
from agentbolt.policies import Policies, PolicyLightningRL, match

ROLES = Policies({"writer": match("write_query"), "rewriter": match("rewrite_query")})
"""The SQL agent's roles: check_query belongs to no policy."""


def sql_rollout(rid: str, reward: float, *, rewrites: int, served: dict[str, str | None] | None = None) -> Trace:
    """write_query, check_query, then ``rewrites`` rewrite_query calls, each named at the gateway and
    served by its agent's policy (``served`` overrides the policy a node's calls were served by)."""
    routes = {"write_query": "writer", "rewrite_query": "rewriter", "check_query": None, **(served or {})}
    tr = Trace(rid, group_id="task-1")
    context = [1, 2, 3]
    for node in ["write_query", "check_query"] + ["rewrite_query"] * rewrites:
        response = [len(context) + 100, 7]
        tr.llm(context, response, agent_name=node, policy=routes[node])
        context = [*context, *response, 9]
    tr.final(reward)
    return tr


def process(lrl: PolicyLightningRL | LightningRL, traces: list[Trace]):  # type: ignore[no-untyped-def]
    return lrl.process([t.rollout for t in traces], {t.rollout.rollout_id: t.spans for t in traces})


GROUP = [
    ("r1", 1.0, 0),  # the writer got it right: no rewrite
    ("r2", 0.0, 1),
    ("r3", 1.0, 2),  # rewriting fixed it
    ("r4", 0.0, 0),
]


def traces() -> list[Trace]:
    return [sql_rollout(rid, reward, rewrites=n) for rid, reward, n in GROUP]


def test_each_policy_trains_only_its_agents_and_the_unmatched_role_is_excluded_with_a_reason() -> None:
    batch = process(PolicyLightningRL(ROLES), traces())

    assert {r.agent_name for r in batch.rows_of("writer")} == {"write_query"}
    assert {r.agent_name for r in batch.rows_of("rewriter")} == {"rewrite_query"}
    assert len(batch.rows_of("writer")) == 4 and len(batch.rows_of("rewriter")) == 3
    assert len(batch.rows) == 7

    report = batch.report  # every call once
    assert report.calls == 4 + 4 + 3 and report.trained_calls == 7
    assert report.excluded == {"no_policy": 4}
    assert report.per_agent["check_query"].model_dump() == {"calls": 4, "trained": 0, "excluded": {"no_policy": 4}}
    assert {e.reason for e in report.examples} == {"no_policy"}
    assert "no policy's match selects" in report.summary()

    own = batch.policy_reports["rewriter"]  # restricted to the rewriter's calls
    assert own.calls == 3 and own.excluded == {} and set(own.per_agent) == {"rewrite_query"}
    metrics = batch.metrics()
    assert metrics["lightningrl/excluded/no_policy"] == 4
    assert metrics["lightningrl/policy/writer/transitions"] == 4
    assert metrics["lightningrl/policy/rewriter/transitions"] == 3
    assert not any("/agent/" in k for k in metrics if k.startswith("lightningrl/policy/"))


def test_a_role_is_compared_with_the_rollouts_where_that_role_acted() -> None:
    """GRPO per policy: the rewriter's baseline is the group's rollouts that had a rewrite (r2, r3),
    exactly what LightningRL gives when only the rewriter's calls are selected."""
    batch = process(PolicyLightningRL(ROLES), traces())
    alone = process(LightningRL(agent_match=["rewrite_query"]), traces())

    assert [r.advantage for r in batch.rows_of("rewriter")] == pytest.approx([r.advantage for r in alone.rows])
    by_rollout = {r.rollout_id: r.advantage for r in batch.rows_of("rewriter")}
    assert set(by_rollout) == {"r2", "r3"} and by_rollout["r3"] > 0 > by_rollout["r2"]
    writers = process(LightningRL(agent_match=["write_query"]), traces())
    assert [r.advantage for r in batch.rows_of("writer")] == pytest.approx([r.advantage for r in writers.rows])


def test_each_policy_can_have_its_own_credit() -> None:
    policies = Policies(
        {
            "writer": match("write_query"),
            "rewriter": match(
                "rewrite_query", lightningrl=LightningRLConfig(credit="discounted", credit_options={"gamma": 0.5})
            ),
        }
    )
    lrl = PolicyLightningRL(policies, LightningRLConfig(credit="final"))
    batch = process(lrl, traces())

    assert lrl.config_of("rewriter").credit == "discounted" and lrl.config_of("writer").credit == "final"
    r3 = [r.reward for r in batch.rows_of("rewriter") if r.rollout_id == "r3"]
    assert r3 == pytest.approx([0.5, 1.0])  # return-to-go over the calls with gamma 0.5: the last call gets 1
    assert [r.reward for r in batch.rows_of("writer") if r.rollout_id == "r3"] == [1.0]


def test_a_call_served_by_another_policy_is_never_trained() -> None:
    """The gateway routed by the name it knew when the call was made; if that disagrees with the
    agent the call is attributed to, training it would be off-policy by construction."""
    mixed = [
        sql_rollout("r1", 1.0, rewrites=1, served={"rewrite_query": "writer"}),
        sql_rollout("r2", 0.0, rewrites=1, served={"write_query": None}),  # the gateway could not name it
        sql_rollout("r3", 1.0, rewrites=1),
    ]
    batch = process(PolicyLightningRL(ROLES), mixed)

    assert {r.rollout_id for r in batch.rows_of("rewriter")} == {"r2", "r3"}
    assert {r.rollout_id for r in batch.rows_of("writer")} == {"r1", "r3"}
    assert batch.report.excluded == {"no_policy": 3, "policy_mismatch": 2}
    details = {e.rollout_id: e.detail for e in batch.report.examples if e.reason == "policy_mismatch"}
    assert "served by policy 'writer'" in details["r1"]
    assert "served by the base model" in details["r2"]


def test_one_shared_policy_gives_exactly_lightningrls_rows() -> None:
    config = LightningRLConfig(agent_match=r"^(write|rewrite)_query$")
    shared = process(PolicyLightningRL(Policies.shared(), config), traces())
    plain = process(LightningRL(config), traces())

    assert [(r.rollout_id, r.index, r.advantage, r.loss_weight) for r in shared.rows] == [
        (r.rollout_id, r.index, r.advantage, r.loss_weight) for r in plain.rows
    ]
    assert shared.report.excluded == plain.report.excluded == {"agent_not_selected": 4}


def test_the_shared_configs_agent_match_still_applies_inside_a_policy() -> None:
    policies = Policies({"queries": match(re.compile("_query$"))})
    served = {"write_query": "queries", "rewrite_query": "queries", "check_query": "queries"}
    ts = [sql_rollout(rid, reward, rewrites=n, served=served) for rid, reward, n in GROUP]
    batch = process(PolicyLightningRL(policies, LightningRLConfig(agent_match=["write_query"])), ts)
    assert {r.agent_name for r in batch.rows} == {"write_query"}
    assert batch.report.excluded == {"agent_not_selected": 7}


def test_a_policy_without_rows_is_fine_no_rows_at_all_is_an_explicit_error() -> None:
    no_rewrites = [sql_rollout(f"r{i}", float(i % 2), rewrites=0) for i in range(4)]
    batch = process(PolicyLightningRL(ROLES), no_rewrites)
    assert batch.rows_of("rewriter") == [] and len(batch.rows_of("writer")) == 4

    only_checker = Policies({"checker": match("nobody")})
    with pytest.raises(EmptyBatchError, match="no_policy"):
        process(PolicyLightningRL(only_checker), no_rewrites)


def test_staleness_is_measured_from_each_policys_own_version() -> None:
    config = LightningRLConfig(max_staleness=0)
    lrl = PolicyLightningRL(ROLES, config)
    ts = traces()  # every call sampled at version 1
    batch = lrl.process(
        [t.rollout for t in ts],
        {t.rollout.rollout_id: t.spans for t in ts},
        policy_versions={"writer": 1, "rewriter": 2},
    )
    assert len(batch.rows_of("writer")) == 4 and batch.rows_of("rewriter") == []
    assert batch.report.excluded == {"no_policy": 4, "stale": 3}


def test_a_policy_config_without_a_bound_takes_the_runs_and_its_own_bound_wins() -> None:
    """An asynchronous run's ``max_staleness`` holds for a policy whose own config declares none
    (its stale calls would otherwise train); a policy's own bound stays its own."""
    ts = traces()  # every call sampled at version 1
    for own, expected in ((None, 0), (5, 5)):
        policies = Policies(
            {
                "writer": match("write_query"),
                "rewriter": match("rewrite_query", lightningrl=LightningRLConfig(credit="final", max_staleness=own)),
            }
        )
        lrl = PolicyLightningRL(policies, LightningRLConfig(max_staleness=0))
        assert lrl.config_of("rewriter").max_staleness == expected and lrl.config_of("rewriter").credit == "final"
        batch = lrl.process(
            [t.rollout for t in ts],
            {t.rollout.rollout_id: t.spans for t in ts},
            policy_versions={"writer": 1, "rewriter": 2},
        )
        assert len(batch.rows_of("rewriter")) == (0 if own is None else 3)
