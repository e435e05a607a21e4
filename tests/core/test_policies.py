"""Policies by role (agentbolt.policies): the declaration, and the gateway routing each call to its
agent's policy (through Trainer against the fake backend, and `agentbolt gateway serve --policy`)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
from typing import Any

import pytest
from openai import AsyncOpenAI

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.algorithm import Algorithm
from agentbolt.errors import UserError
from agentbolt.lightningrl import LightningRLConfig
from agentbolt.options import CaptureOptions, RunnerOptions
from agentbolt.policies import BASE_POLICY, Policies, PolicySpec, match
from agentbolt.store.memory import MemoryStore
from agentbolt.testing.fake_llm import FakeLLM, FakeLLMServer
from agentbolt.trainer import Trainer

PLANNER = "You are the planner. Write a short plan."
SOLVER = "You are the solver. Follow the plan and answer."
CRITIC = "Grade the answer."


# -- the declaration ---------------------------------------------------------------------------------


def test_match_takes_exact_names_so_write_query_does_not_select_rewrite_query() -> None:
    policies = Policies({"writer": match("write_query"), "rewriter": match("rewrite_query")})
    assert policies.policy_for("write_query") == "writer"
    assert policies.policy_for("rewrite_query") == "rewriter"
    assert policies.policy_for("check_query") is None and policies.policy_for(None) is None
    assert not policies.is_shared and policies.router() is not None
    assert policies.names == ("writer", "rewriter") and list(policies) == ["writer", "rewriter"]


def test_patterns_predicates_and_first_match_wins() -> None:
    policies = Policies(
        {
            "judge": match(lambda name: name is not None and name.endswith("_judge")),
            "writers": match(re.compile(r"write")),
            "rest": match(),
        }
    )
    assert policies.policy_for("style_judge") == "judge"
    assert policies.policy_for("rewrite_query") == "writers"  # a regex is searched, as agent_match is
    assert policies.policy_for("check_query") == "rest" and policies.policy_for(None) == "rest"


def test_the_default_is_one_shared_policy_that_routes_nothing() -> None:
    for value in (None, Policies.shared(), {"everything": match()}, {"everything": PolicySpec()}):
        policies = Policies.from_value(value)
        assert policies.is_shared and policies.router() is None and len(policies) == 1


def test_bad_declarations_say_what_to_do() -> None:
    with pytest.raises(UserError, match="declare it last"):
        Policies({"all": match(), "writer": match("write_query")})
    with pytest.raises(UserError, match="letters, digits"):
        Policies({"my.policy": match("a")})
    with pytest.raises(UserError, match="reserved"):
        Policies({BASE_POLICY: match("a")})
    with pytest.raises(UserError, match="non-empty mapping"):
        Policies({})
    with pytest.raises(UserError, match="unknown setting; valid: match, rank"):
        match("a", rnk=8)
    with pytest.raises(UserError, match="rank"):
        match("a", rank=0)
    with pytest.raises(UserError, match="not a valid regular expression"):
        PolicySpec(match="(")
    with pytest.raises(UserError, match=r"one re\.compile"):
        match(re.compile("a"), re.compile("b"))
    with pytest.raises(UserError, match="invalid LightningRLConfig"):
        match("a", lightningrl={"credit": "final", "typo": 1})
    with pytest.raises(UserError, match="no policy 'x'"):
        Policies({"a": match("a")})["x"]


def test_the_command_line_form_and_the_recorded_form() -> None:
    policies = Policies.from_specs(["writer=write_query", "rewriter=re:^rewrite", "both=a,b"])
    assert policies is not None
    assert [policies.policy_for(n) for n in ("write_query", "rewrite_query", "a", "b")] == [
        "writer",
        "rewriter",
        "both",
        "both",
    ]
    assert Policies.from_specs([]) is None
    for bad in ("writer", "=x", "w=", "w=re:("):
        with pytest.raises(UserError):
            Policies.from_specs([bad])
    record = Policies(
        {"w": match("write_query", rank=8, lr=1e-4, lightningrl=LightningRLConfig(credit="discounted"))}
    ).as_record()
    assert json.loads(json.dumps(record))["w"]["match"] == ["write_query"]
    assert record["w"]["rank"] == 8 and record["w"]["lightningrl"]["credit"] == "discounted"


# -- routing at the gateway ------------------------------------------------------------------------


async def three_roles(task: dict[str, Any], resources: t.Resources) -> float:
    """One client, three roles told apart only by their system prompts."""
    assert resources.llm is not None
    async with AsyncOpenAI(base_url=resources.llm.base_url, api_key="x", max_retries=0) as client:
        for system in (PLANNER, SOLVER, CRITIC):
            await client.chat.completions.create(
                model=resources.llm.model,
                messages=[{"role": "system", "content": system}, {"role": "user", "content": task["question"]}],
            )
    return 1.0


def spans_of(store: MemoryStore) -> list[t.Span]:
    async def collect() -> list[t.Span]:
        rollouts = (await store.query_rollouts(limit=100)).items
        spans = await store.query_spans([r.rollout_id for r in rollouts])
        return [s for r in rollouts for s in spans[r.rollout_id] if semconv.TOKEN_SOURCE in s.attributes]

    return asyncio.run(collect())


def test_the_gateway_asks_the_upstream_for_each_calls_policy_and_records_it() -> None:
    store = MemoryStore()
    with FakeLLMServer(FakeLLM(default_reply="42")) as server:
        trainer = Trainer(
            three_roles,
            store=store,
            runners=RunnerOptions(n=0),
            progress=False,
            capture=CaptureOptions(adapters=[], agent_names={"planner": "You are the planner", "solver": "solver"}),
            policies={"plans": match("planner"), "answers": match("solver")},
        )
        result = trainer.dev([{"question": "q"}], llm=server.base_url, model="base-model")
    assert result.failed == 0
    calls = [
        (s.attributes.get(semconv.GEN_AI_AGENT_NAME), s.attributes[semconv.GEN_AI_REQUEST_MODEL])
        for s in spans_of(store)
    ]
    assert calls == [("planner", "plans"), ("solver", "answers"), (None, "base-model")]
    served = [s.attributes.get(semconv.POLICY_NAME) for s in spans_of(store)]
    assert served == ["plans", "answers", None]  # the critic matches no policy: the base model serves it

    async def recorded() -> dict[str, Any]:
        (run,) = await store.list_runs()
        return run.config

    assert set(asyncio.run(recorded())["policies"]) == {"plans", "answers"}


def test_one_shared_policy_changes_nothing_at_the_gateway() -> None:
    store = MemoryStore()
    with FakeLLMServer(FakeLLM(default_reply="42")) as server:
        Trainer(
            three_roles,
            store=store,
            runners=RunnerOptions(n=0),
            progress=False,
            capture=CaptureOptions(adapters=[]),
            policies={"everything": match()},
        ).dev([{"question": "q"}], llm=server.base_url, model="base-model")
    spans = spans_of(store)
    assert [s.attributes[semconv.GEN_AI_REQUEST_MODEL] for s in spans] == ["base-model"] * 3
    assert not any(semconv.POLICY_NAME in s.attributes for s in spans)


class OnePolicyOnly(Algorithm):
    name = "one-policy-only"

    async def run(self, ctx: Any, train: Any, val: Any) -> None:  # pragma: no cover - refused before
        raise AssertionError("not reached")


def test_an_algorithm_that_trains_one_policy_refuses_policies_by_role() -> None:
    trainer = Trainer(
        three_roles,
        OnePolicyOnly(),
        store=MemoryStore(),
        runners=RunnerOptions(n=0),
        progress=False,
        policies={"plans": match("planner")},
    )
    with pytest.raises(UserError, match="trains one shared policy; policies by role"):
        trainer.fit([{"question": "q"}])


def test_gateway_serve_routes_by_policy_from_the_command_line(tmp_path: Any) -> None:
    """`agentbolt gateway serve --agent-name ... --policy plans=planner`, a real process."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"sqlite:///{tmp_path / 'gw.db'}"

    async def attempt() -> tuple[str, str]:
        from agentbolt.store import open_store

        store = open_store(url)
        await store.enqueue([t.RolloutSpec(rollout_id="r")])
        (claim,) = await store.dequeue("w", lease_s=3600)  # the CLI may take long to start on a busy machine
        await store.close()
        return "r", claim.attempt.attempt_id

    rid, aid = asyncio.run(attempt())
    with FakeLLMServer(FakeLLM(default_reply="42")) as server:
        args = ["gateway", "serve", "--store", url, "--upstream", server.base_url, "--port", str(port)]
        args += ["--model", "base", "--agent-name", "planner=You are the planner", "--policy", "plans=planner"]
        proc = subprocess.Popen([sys.executable, "-m", "agentbolt.cli", *args], stderr=subprocess.PIPE, env=os.environ)
        try:
            assert proc.stderr is not None and "listening" in proc.stderr.readline().decode()

            async def calls() -> None:
                base = f"http://127.0.0.1:{port}/rollouts/{rid}/attempts/{aid}/v1"
                async with AsyncOpenAI(base_url=base, api_key="x", max_retries=0) as client:
                    for system in (PLANNER, CRITIC):
                        await client.chat.completions.create(
                            model="m",
                            messages=[{"role": "system", "content": system}, {"role": "user", "content": "q"}],
                        )

            asyncio.run(calls())
        finally:
            proc.terminate()
            proc.wait(30)

    async def models() -> list[Any]:
        from agentbolt.store import open_store

        store = open_store(url)
        spans = (await store.query_spans([rid]))[rid]
        await store.close()
        return [
            (s.attributes[semconv.GEN_AI_REQUEST_MODEL], s.attributes.get(semconv.POLICY_NAME))
            for s in spans
            if semconv.TOKEN_SOURCE in s.attributes
        ]

    assert asyncio.run(models()) == [("plans", "plans"), ("base", None)]
