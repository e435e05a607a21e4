"""verifiers environments (written with verifiers' own API) trained through agentbolt: the
rollout is verifiers' own episode with its client on the gateway, so every call has exact ids,
and each rollout's reward is what verifiers itself scores for the same completions."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from typing import Any

import pytest
from vf_run import dev_run, direct_episodes

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.environments import environment_agent
from agentbolt.errors import UserError
from agentbolt.testing.fake_llm import FakeLLM, FakeLLMServer, FakeRequest, FakeTokenizer, Rule, ToolCall, ToolCalls
from agentbolt_verifiers import VerifiersAgent, load_environment, parse_reference, tasks

NULL_HARNESS = {"harness": {"id": "null"}}


def arith_reply(request: FakeRequest) -> str:
    """The sum for even first operands, a wrong sum for odd ones; long for multiples of 4."""
    a, b = map(int, re.search(r"What is (\d+) \+ (\d+)", request.text).groups())
    answer = a + b if a % 2 == 0 else a + b + 1
    return f"The answer is {answer}" if a % 4 == 0 else str(answer)


def adder_reply(request: FakeRequest) -> Any:
    """Call the add tool first; once its result is in, answer with it."""
    messages = request.messages or []
    if messages and messages[-1]["role"] == "tool":
        content = messages[-1]["content"]
        text = content if isinstance(content, str) else " ".join(p.get("text", "") for p in content)
        return f"The sum is {text.strip()}"
    a, b = map(int, re.search(r"what is (\d+) \+ (\d+)", request.text).groups())
    name = next(tool["function"]["name"] for tool in request.tools or [] if tool["function"]["name"].endswith("add"))
    return ToolCalls([ToolCall(name, {"a": a, "b": b})])


def final_reward_span(run: Any, rollout_id: str) -> t.Span:
    finals = [s for s in run.reward_spans(rollout_id) if s.attributes.get(semconv.REWARD_IS_FINAL)]
    assert len(finals) == 1, run.spans[rollout_id]
    return finals[0]


@pytest.mark.timeout(900)  # 12 verifiers episodes, each starting a chat program; slow on a busy 2-core machine
def test_single_turn_environment_trains_with_exact_ids_and_its_own_rewards() -> None:
    env = load_environment("arith-env", agent=NULL_HARNESS)
    items = tasks(env)
    assert [task.task_id for task in items] == [f"add-{i + 2}-{3 * i + 1}" for i in range(6)]
    with FakeLLMServer(FakeLLM(rules=[Rule(reply=arith_reply)])) as server:
        run = dev_run(env, items, server.base_url)  # Trainer takes the verifiers Env object itself
        direct = asyncio.run(direct_episodes(load_environment("arith-env", agent=NULL_HARNESS), server.base_url))
    assert run.result.failed == 0, run.result.failures
    assert len(run.rollouts) == len(items)
    # one gateway call per rollout; every call becomes one transition with the backend's exact ids
    assert all(len(run.llm_spans(r.rollout_id)) == 1 for r in run.rollouts)
    assert len(run.transitions) == len(run.rollouts)
    tok = FakeTokenizer()
    by_rollout = {tr.rollout_id: tr for tr in run.transitions}
    rewards = set()
    for rollout in run.rollouts:
        episode = direct[rollout.task_id]
        trace = episode.traces[0]
        assert episode.ok
        # the reward is verifiers' own score of the same completion (weighted sum of its rewards)
        assert rollout.final_reward == pytest.approx(trace.reward)
        dims = json.loads(final_reward_span(run, rollout.rollout_id).attributes[semconv.REWARD_DIMENSIONS])
        assert dims == {"reward": pytest.approx(trace.reward)} | {k: r.score for k, r in trace.rewards.items()}
        tr = by_rollout[rollout.rollout_id]
        assert tr.token_source is t.TokenSource.EXACT
        assert tr.response_ids == tok.encode(trace.last_reply)  # the tokens of the completion scored
        assert tr.prompt_ids == tok.render_chat([{"role": "user", "content": trace.messages[0].content}])
        rewards.add(rollout.final_reward)
    # right and brief 1 + 0.25; wrong but brief 0.25; right but long (not the exact number) 0
    assert rewards == {0.0, 0.25, 1.25}


@pytest.mark.timeout(900)  # each episode also starts the environment's MCP tool server
def test_multi_turn_tool_environment_runs_its_tool_server_through_the_gateway() -> None:
    env = load_environment("adder-tools-env", agent=NULL_HARNESS, taskset={"num_tasks": 2})
    items = tasks(env)
    with FakeLLMServer(FakeLLM(rules=[Rule(reply=adder_reply)])) as server:
        run = dev_run(env, items, server.base_url)
        direct = asyncio.run(
            direct_episodes(
                load_environment("adder-tools-env", agent=NULL_HARNESS, taskset={"num_tasks": 2}), server.base_url
            )
        )
    assert run.result.failed == 0, run.result.failures
    assert len(run.rollouts) == 2
    for rollout in run.rollouts:
        calls = run.llm_spans(rollout.rollout_id)
        assert len(calls) == 2  # the tool call, then the answer with the tool's result
        trace = direct[rollout.task_id].traces[0]
        assert trace.metrics["tool_calls"] == 1.0
        assert rollout.final_reward == trace.reward == 1.0
        tool_msgs = [m for m in trace.messages if m.role == "tool"]
        a, b = (rollout.input["a"], rollout.input["b"])
        assert [str(m.content).strip() for m in tool_msgs] == [str(a + b)]  # the MCP tool really ran
    assert len(run.transitions) == 4
    assert all(tr.token_source is t.TokenSource.EXACT and tr.prompt_ids and tr.response_ids for tr in run.transitions)
    # the second call's prompt extends the first call's prompt and response (one conversation)
    for rollout in run.rollouts:
        first, second = sorted(
            (tr for tr in run.transitions if tr.rollout_id == rollout.rollout_id), key=lambda x: x.index
        )
        assert second.prompt_ids[: len(first.prompt_ids)] == first.prompt_ids


def test_installed_environment_by_name_and_config_query() -> None:
    agent = environment_agent("verifiers://arith-env?agent.harness.id=null&taskset.num_tasks=2")
    assert isinstance(agent, VerifiersAgent)
    items = tasks(agent.env)
    assert len(items) == 2
    with FakeLLMServer(FakeLLM(rules=[Rule(reply=arith_reply)])) as server:
        run = dev_run("verifiers://arith-env?agent.harness.id=null&taskset.num_tasks=2", items, server.base_url)
    assert run.result.failed == 0, run.result.failures
    assert sorted(r.final_reward for r in run.rollouts) == [0.25, 1.25]  # 2 + 1 right and brief, 3 + 4 wrong


def test_reference_parsing_and_errors() -> None:
    assert parse_reference("arith-env?agent.harness.id=null&taskset.num_tasks=3") == (
        "arith-env",
        {"agent": {"harness": {"id": "null"}}, "taskset": {"num_tasks": "3"}},
    )
    with pytest.raises(UserError, match="not installed"):
        load_environment("no-such-verifiers-env")
    with pytest.raises(UserError, match="unknown environment kind 'nope'"):
        environment_agent("nope://x")
    agent = VerifiersAgent("arith-env", agent=NULL_HARNESS)
    with pytest.raises(UserError, match="wire data"):
        agent.task("not a dict")


def test_failed_episode_fails_the_rollout_with_its_errors() -> None:
    env = load_environment("arith-env", agent=NULL_HARNESS, taskset={"num_tasks": 1})
    from agentbolt.testing.fake_llm import Failure

    with FakeLLMServer(FakeLLM(failures=[Failure(status=400, message="bad request from the test")])) as server:
        run = dev_run(env, tasks(env), server.base_url)
    assert run.result.failed == 1
    (rollout,) = run.rollouts
    assert rollout.status is t.RolloutStatus.FAILED
    assert "verifiers episode failed" in rollout.error.message


def test_loading_the_plugin_imports_no_verifiers() -> None:
    """Every store, runner and CLI command loads the plugins: the entry module (which imports the
    package) must leave verifiers, and what it pulls in (sympy), unimported until a name is used."""
    code = (
        "import sys, agentbolt_verifiers.plugin, agentbolt_verifiers as p\n"
        "heavy = sorted(m for m in ('verifiers', 'sympy') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
        "p.export_environment\n"
        "assert 'verifiers' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
