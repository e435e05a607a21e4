"""Trainer capture options, through the gateway against the fake backend: agents named from their
system prompts with no change to their code, and retokenization with drift checks."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
from openai import AsyncOpenAI

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.capture.roles import AgentRoles
from agentbolt.errors import UserError
from agentbolt.lightningrl import LightningRL
from agentbolt.options import CaptureOptions, RunnerOptions
from agentbolt.store.memory import MemoryStore
from agentbolt.testing.fake_llm import FakeLLM, FakeLLMServer, FakeTokenizer, Rule, ToolCall, ToolCalls
from agentbolt.trainer import Trainer

PLANNER = "You are the planner. Write a short plan."
SOLVER = "You are the solver. Follow the plan and answer."
CRITIC = "Grade the answer."


async def two_roles(task: dict[str, Any], resources: t.Resources) -> float:
    """One plain client, three roles told apart only by their system prompts; no header, no adapter."""
    assert resources.llm is not None
    async with AsyncOpenAI(base_url=resources.llm.base_url, api_key="x", max_retries=0) as client:

        async def ask(system: str, user: str) -> str:
            r = await client.chat.completions.create(
                model=resources.llm.model,
                messages=[{"role": "system", "content": system}, {"role": "user", "content": user}],
            )
            return r.choices[0].message.content or ""

        plan = await ask(PLANNER, task["question"])
        answer = await ask(SOLVER, f"{task['question']}\nPlan: {plan}")
        await ask(CRITIC, answer)
    return 1.0 if "42" in answer else 0.0


def run(
    agent: Any, backend: FakeLLM, tasks: list[Any], **capture: Any
) -> tuple[list[t.Rollout], dict[str, list[t.Span]]]:
    store = MemoryStore()
    with FakeLLMServer(backend) as server:
        trainer = Trainer(
            agent,
            store=store,
            runners=RunnerOptions(n=0),
            progress=False,
            capture=CaptureOptions(adapters=[], **capture),
        )
        result = trainer.dev(tasks, llm=server.base_url, model="fake-model")
    assert result.failed == 0, result.failures

    async def collect() -> tuple[list[t.Rollout], dict[str, list[t.Span]]]:
        rollouts = (await store.query_rollouts(limit=1000)).items
        return rollouts, await store.query_spans([r.rollout_id for r in rollouts], latest_attempt_only=True)

    return asyncio.run(collect())


TASKS = [{"question": "What is 6 times 7?"}, {"question": "And 7 times 6?"}]


def test_roles_told_apart_by_system_prompt_become_agent_names() -> None:
    rollouts, spans = run(
        two_roles,
        FakeLLM(default_reply="The answer is 42."),
        TASKS,
        agent_names={"planner": "You are the planner", "solver": re.compile(r"^You are the solver\.")},
    )
    batch = LightningRL(credit="final", advantage="grpo", agent_match="planner|solver").process(rollouts, spans)
    for episode in batch.episodes:
        assert [c.agent_name for c in episode.calls] == ["planner", "solver", None]
    assert sorted(tr.agent_name for tr in batch.transitions) == ["planner", "planner", "solver", "solver"]
    assert all(tr.token_source is t.TokenSource.EXACT for tr in batch.transitions)
    only_solver = LightningRL(credit="final", advantage="grpo", agent_match="solver").process(rollouts, spans)
    assert {tr.agent_name for tr in only_solver.transitions} == {"solver"}


def test_without_rules_the_same_agent_has_no_names() -> None:
    rollouts, spans = run(two_roles, FakeLLM(default_reply="The answer is 42."), TASKS[:1])
    calls = LightningRL(credit="final", advantage="grpo").process(rollouts, spans).episodes[0].calls
    assert [c.agent_name for c in calls] == [None, None, None]


def test_roles_by_tools_and_by_function() -> None:
    request = {
        "messages": [{"role": "system", "content": [{"type": "text", "text": "x"}]}],
        "tools": [
            {"type": "function", "function": {"name": "search"}},
            {"type": "function", "function": {"name": "open"}},
        ],
    }
    assert AgentRoles(tools={"browser": ["search", "open"]})(request) == "browser"
    assert AgentRoles(tools={"browser": ["search", "click"]})(request) is None
    assert AgentRoles(function=lambda r: "judge" if len(r["messages"]) == 1 else None)(request) == "judge"
    with pytest.raises(UserError, match="non-empty substring"):
        AgentRoles(system_prompt={"x": ""})


WEATHER = ToolCalls([ToolCall("get_weather", {"city": "Paris"})])


async def tool_agent(task: dict[str, Any], resources: t.Resources) -> float:
    assert resources.llm is not None
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    messages: list[Any] = [{"role": "system", "content": "Use tools."}, {"role": "user", "content": task["question"]}]
    async with AsyncOpenAI(base_url=resources.llm.base_url, api_key="x", max_retries=0) as client:
        first = await client.chat.completions.create(model="m", messages=messages, tools=tools)
        call = first.choices[0].message.tool_calls[0]
        messages += [first.choices[0].message.model_dump(exclude_none=True)]
        messages += [{"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
        second = await client.chat.completions.create(model="m", messages=messages, tools=tools)
    return 1.0 if second.choices[0].message.content else 0.0


def no_ids_backend() -> FakeLLM:
    """A backend that ignores return_token_ids (a hosted API)."""
    return FakeLLM(rules=[Rule(match="weather", reply=[WEATHER])], default_reply="It is sunny.", token_ids=False)


def test_exact_mode_records_missing_ids_from_a_text_only_backend() -> None:
    rollouts, spans = run(tool_agent, no_ids_backend(), [{"question": "weather in Paris?"}])
    llm = [s for s in spans[rollouts[0].rollout_id] if semconv.TOKEN_SOURCE in s.attributes]
    assert [s.attributes[semconv.TOKEN_SOURCE] for s in llm] == ["missing", "missing"]


def test_retokenize_rebuilds_the_ids_the_backend_would_have_returned() -> None:
    tok = FakeTokenizer()
    rollouts, spans = run(
        tool_agent, no_ids_backend(), [{"question": "weather in Paris?"}], token_ids="retokenize", tokenizer=tok
    )
    llm = [s for s in spans[rollouts[0].rollout_id] if semconv.TOKEN_SOURCE in s.attributes]
    assert [s.attributes[semconv.TOKEN_SOURCE] for s in llm] == ["retokenized", "retokenized"]
    assert not any(semconv.TOKEN_DRIFT in s.attributes for s in llm)  # counts and text agree
    first, second = llm
    assert first.attributes[semconv.RESPONSE_TOKEN_IDS] == tok.render_tool_calls([("get_weather", '{"city":"Paris"}')])
    assert second.attributes[semconv.RESPONSE_TOKEN_IDS] == tok.encode("It is sunny.")
    batch = LightningRL(credit="final", advantage="grpo", allow_retokenized=True).process(rollouts, spans)
    assert len(batch.transitions) == 2
    excluded = LightningRL(credit="final", advantage="grpo", allow_empty=True).process(rollouts, spans)
    assert excluded.report.excluded == {"retokenized": 2}


class OtherTemplate(FakeTokenizer):
    """A tokenizer whose chat template is not the backend's: it adds a default system prompt."""

    def render_chat(self, messages: Any, tools: Any = None, *, add_generation_prompt: bool = True) -> list[int]:
        return super().render_chat(
            [{"role": "system", "content": "You are helpful."}, *messages],
            tools,
            add_generation_prompt=add_generation_prompt,
        )


def test_drifted_calls_are_flagged_and_excluded_with_the_reason() -> None:
    rollouts, spans = run(
        tool_agent,
        no_ids_backend(),
        [{"question": "weather in Paris?"}],
        token_ids="retokenize",
        tokenizer=OtherTemplate(),
    )
    llm = [s for s in spans[rollouts[0].rollout_id] if semconv.TOKEN_SOURCE in s.attributes]
    assert all(
        re.match(r"prompt: \d+ tokens retokenized, the backend reported \d+", s.attributes[semconv.TOKEN_DRIFT])
        for s in llm
    )
    batch = LightningRL(credit="final", advantage="grpo", allow_retokenized=True, allow_empty=True).process(
        rollouts, spans
    )
    assert batch.transitions == []
    assert batch.report.excluded == {"token_drift": 2}


def test_retokenize_needs_a_tokenizer() -> None:
    with pytest.raises(UserError, match="needs the policy's tokenizer"):
        Trainer(
            two_roles,
            store="memory://",
            runners=RunnerOptions(n=0),
            capture=CaptureOptions(token_ids="retokenize"),
        )
    with pytest.raises(UserError, match="'exact' or 'retokenize'"):
        Trainer(
            two_roles,
            store="memory://",
            runners=RunnerOptions(n=0),
            capture=CaptureOptions(token_ids="approx"),
        )  # type: ignore[arg-type]


def test_gateway_serve_names_agents_from_the_command_line(tmp_path: Any) -> None:
    """`agentbolt gateway serve --agent-name planner=... --agent-name solver=re:...`, a real process."""
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"sqlite:///{tmp_path / 'gw.db'}"

    async def attempt() -> tuple[str, str]:
        from agentbolt.store import open_store

        store = open_store(url)
        await store.enqueue([t.RolloutSpec(rollout_id="r")])
        (claim,) = await store.dequeue("w")
        await store.close()
        return "r", claim.attempt.attempt_id

    rid, aid = asyncio.run(attempt())
    with FakeLLMServer(FakeLLM(default_reply="The answer is 42.")) as server:
        args = ["gateway", "serve", "--store", url, "--upstream", server.base_url, "--port", str(port)]
        args += ["--agent-name", "planner=You are the planner", "--agent-name", r"solver=re:^You are the solver\."]
        proc = subprocess.Popen([sys.executable, "-m", "agentbolt.cli", *args], stderr=subprocess.PIPE, env=os.environ)
        try:
            assert proc.stderr is not None and "listening" in proc.stderr.readline().decode()

            async def calls() -> None:
                base = f"http://127.0.0.1:{port}/rollouts/{rid}/attempts/{aid}/v1"
                async with AsyncOpenAI(base_url=base, api_key="x", max_retries=0) as client:
                    for system in (PLANNER, SOLVER, CRITIC):
                        await client.chat.completions.create(
                            model="m",
                            messages=[{"role": "system", "content": system}, {"role": "user", "content": "q"}],
                        )

            asyncio.run(calls())
        finally:
            proc.terminate()
            proc.wait(30)

    async def names() -> list[Any]:
        from agentbolt.store import open_store

        store = open_store(url)
        spans = (await store.query_spans([rid]))[rid]
        await store.close()
        return [s.attributes.get(semconv.GEN_AI_AGENT_NAME) for s in spans if semconv.TOKEN_SOURCE in s.attributes]

    assert asyncio.run(names()) == ["planner", "solver", None]
