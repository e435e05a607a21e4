"""The LlamaIndex case of issue 37, for real: a FunctionAgent with two tools, instrumented as its
users do for Phoenix (OpenInference's ``LlamaIndexInstrumentor``), through ``Trainer.dev``
against the fake backend with exact ids, streaming and not.

How to run (not in the workspace environment: llama-index-llms-openai 0.8 needs ``openai`` < 3,
the workspace locks 3.x; it skips there, whatever ``CI`` says, and no CI job builds its
environment: run it by hand as below, and ``record.py`` writes its record,
docs/runs/reconciliation_llamaindex.json, which docs/reconciliation.md's figures are tied to. The
framework matrix's LlamaIndex row is a different, smaller run: one agent, one tool, 2 calls a
task, the matrix's checks)::

    uv venv -p 3.11 /tmp/llama && VIRTUAL_ENV=/tmp/llama uv pip install \\
        "llama-index-core>=0.14,<0.15" llama-index-llms-openai \\
        "openinference-instrumentation-llama-index>=4.6,<4.7" pytest pytest-asyncio pytest-timeout hypothesis \\
        -e packages/core -e packages/adapter-openinference
    /tmp/llama/bin/python -m pytest tests/llamaindex -q -p no:randomly

What it asserts, from the store: LightningRL calls = gateway calls = backend calls = 22 (the
hand-count), every call with exact ids and joined to the instrumentation's own LLM span (by
parent when the request runs inside ``achat``, by request fingerprint when the streamed request
outlives ``astream_chat``), the phantom ``_prepare_chat_with_tools`` LLM spans kept as counted
operations, no rollout flagged; the agent named ``calculator`` (from LlamaIndex's own agent-step
span) and selectable by ``agent_match``, or named by ``CaptureOptions(agent_names=...)`` without
the adapter; the rewards the agent computed; and every credit mode's transition rewards equal
to a hand-computed reference.
"""

from __future__ import annotations

import asyncio
import importlib.util
import re
from typing import Any

import pytest

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.lightningrl import LightningRL
from agentbolt.store.memory import MemoryStore
from agentbolt.testing.fake_llm import FakeLLM, FakeLLMServer, FakeRequest, Rule, ToolCall, ToolCalls
from agentbolt.trainer import Trainer


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


if not (_installed("llama_index.llms.openai") and _installed("openinference.instrumentation.llama_index")):
    # Not in the workspace environment (its openai 3.x conflicts): this file runs in its own
    # environment (the docstring), never skipped there.
    pytest.skip(
        "llama-index-core 0.14, llama-index-llms-openai and openinference-instrumentation-llama-index 4.6 "
        "are not installed: run this file in the environment its docstring builds",
        allow_module_level=True,
    )

from llama_index.core.agent.workflow import FunctionAgent  # noqa: E402
from llama_index.llms.openai import OpenAI  # noqa: E402
from openinference.instrumentation.llama_index import LlamaIndexInstrumentor  # noqa: E402

SYSTEM_PROMPT = "You are a calculator agent: use the tools, then answer with the number."
GAMMA = 0.9
# (question, the reference answer the reward is computed against, LLM calls by hand):
# "(a+b)*c" is add, multiply, answer; "a+b" is add, answer. 6 x 3 + 2 x 2 = 22 calls.
TASKS: list[tuple[str, int, int]] = [
    ("What is (2+3)*4?", 20, 3),
    ("What is (1+1)*5?", 10, 3),
    ("What is (3+4)*2?", 14, 3),
    ("What is (5+5)*3?", 31, 3),  # a wrong reference: the agent's reward is 0
    ("What is (6+1)*6?", 42, 3),
    ("What is (2+2)*9?", 36, 3),
    ("What is 7+8?", 15, 2),
    ("What is 9+9?", 17, 2),  # a wrong reference
]
CALLS = sum(n for _, _, n in TASKS)


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


def make_agent(streaming: bool) -> Any:
    async def agent(task: dict[str, Any], resources: t.Resources) -> float:
        assert resources.llm is not None
        llm = OpenAI(model="gpt-4o-mini", api_base=resources.llm.base_url, api_key="x", max_retries=0)
        calculator = FunctionAgent(
            name="calculator",
            description="Does arithmetic with tools.",
            tools=[add, multiply],
            llm=llm,
            system_prompt=SYSTEM_PROMPT,
            streaming=streaming,
        )
        answer = await calculator.run(user_msg=task["question"])
        numbers = re.findall(r"-?\d+", str(answer))
        return float(bool(numbers) and int(numbers[-1]) == task["answer"])

    return agent


def backend() -> FakeLLM:
    """add, then multiply when the question has one, then the last tool result as the answer."""

    def question(r: FakeRequest) -> str:
        return next(str(m.get("content")) for m in r.messages if m["role"] == "user")

    def results(r: FakeRequest) -> list[str]:
        return [str(m.get("content")) for m in r.messages if m["role"] == "tool"]

    def operands(r: FakeRequest) -> list[int]:
        return [int(x) for x in re.findall(r"\d+", question(r))]

    def reply(r: FakeRequest) -> Any:
        nums, done = operands(r), results(r)
        if not done:
            return ToolCalls([ToolCall("add", {"a": nums[0], "b": nums[1]})])
        if len(done) == 1 and len(nums) == 3:
            return ToolCalls([ToolCall("multiply", {"a": int(done[0]), "b": nums[2]})])
        return done[-1]

    return FakeLLM(rules=[Rule(reply=reply)])


LlamaIndexInstrumentor().instrument()  # what the user's code does for Phoenix; agentbolt is not mentioned


def run(streaming: bool, **capture: Any) -> tuple[list[t.Rollout], dict[str, list[t.Span]], FakeLLM]:
    store, fake = MemoryStore(), backend()
    tasks = [{"question": q, "answer": a} for q, a, _ in TASKS]
    with FakeLLMServer(fake) as server:
        trainer = Trainer(
            make_agent(streaming), store=store, runners={"n": 0, "concurrency": 4}, capture=capture, progress=False
        )
        result = trainer.dev(tasks, llm=server.base_url, model="fake-model")
    assert result.failed == 0 and result.report is not None

    async def read() -> tuple[list[t.Rollout], dict[str, list[t.Span]]]:
        rollouts = (await store.query_rollouts(limit=1000)).items
        return rollouts, await store.query_spans([r.rollout_id for r in rollouts], latest_attempt_only=True)

    rollouts, spans = asyncio.run(read())
    return rollouts, spans, fake


def hand_credit(mode: str, reward: float, calls: int) -> list[float]:
    """Each call's reward under ``mode``: no intermediate reward, no tool error, worked by hand."""
    if mode == "discounted":
        return [reward * GAMMA ** (calls - 1 - i) for i in range(calls)]
    return [reward] * calls  # final; intermediate (no step reward); air (no signal)


@pytest.mark.parametrize("streaming", [False, True], ids=["achat", "astream_chat"])
def test_lightningrl_calls_are_the_gateway_calls(streaming: bool) -> None:
    rollouts, spans, fake = run(streaming)
    by_question = {q: (a, n) for q, a, n in TASKS}
    gateway = {rid: [s for s in ss if semconv.TOKEN_SOURCE in s.attributes] for rid, ss in spans.items()}
    assert sum(map(len, gateway.values())) == len(fake.requests) == CALLS == 22
    assert all(s.attributes[semconv.TOKEN_SOURCE] == "exact" for g in gateway.values() for s in g)

    batch = LightningRL(credit="final", advantage="grpo").process(rollouts, spans)
    assert batch.report.reconciliation["gateway_calls"] == batch.report.reconciliation["calls"] == 22
    assert batch.report.reconciliation.get("flagged_rollouts", 0) == 0
    assert batch.report.trained_calls == 22 and batch.report.excluded == {}
    # One phantom _prepare_chat_with_tools LLM span per call, kept as an operation.
    assert batch.report.reconciliation["unjoined_llm_spans"] == 22
    for episode in batch.episodes:
        question = episode.rollout.input["question"]
        assert len(episode.calls) == by_question[question][1]
        assert all(c.gateway_span is not None and len(c.framework_spans) == 1 for c in episode.calls)
        joined = {c.framework_spans[0].name for c in episode.calls}
        assert joined == {"OpenAI.astream_chat" if streaming else "OpenAI.achat"}
    if streaming:  # the request outlived the span: joined by the request fingerprint
        assert batch.report.extraction["joined_by_fingerprint"] == 22
    else:
        assert batch.report.extraction["joined_by_parent"] == 22

    # Names: LlamaIndex's agent step names the agent; agent_match selects it by name.
    assert {tr.agent_name for tr in batch.transitions} == {"calculator"}
    selected = LightningRL(credit="final", advantage="grpo", agent_match="^calculator$").process(rollouts, spans)
    assert len(selected.transitions) == 22
    other = LightningRL(credit="final", advantage="grpo", agent_match="^planner$", allow_empty=True)
    assert other.process(rollouts, spans).report.excluded == {"agent_not_selected": 22}
    tools = {
        s.attributes.get(semconv.GEN_AI_TOOL_NAME)
        for ss in spans.values()
        for s in ss
        if s.attributes.get(semconv.SPAN_KIND_ATTR) == semconv.KIND_TOOL
    }
    assert tools == {"add", "multiply"}

    # Rewards as the agent computed them, and credit under every mode as worked by hand.
    rewards = {r.rollout_id: r.final_reward for r in rollouts}
    for r in rollouts:
        question = r.input["question"]
        a, b, *c = (int(x) for x in re.findall(r"\d+", question))
        assert rewards[r.rollout_id] == float((a + b) * (c[0] if c else 1) == by_question[question][0])
    for mode in ("final", "discounted", "intermediate", "air"):
        options = {"gamma": GAMMA} if mode == "discounted" else {}
        collected = LightningRL(credit=mode, credit_options=options, advantage="grpo").collect(rollouts, spans)
        for r in rollouts:
            got = [
                tr.reward
                for tr in sorted(collected.transitions, key=lambda x: x.index)
                if tr.rollout_id == r.rollout_id
            ]
            expected = hand_credit(mode, float(rewards[r.rollout_id] or 0.0), by_question[r.input["question"]][1])
            assert got == pytest.approx(expected), (mode, r.input)


def test_agent_names_mapping_names_the_calls_without_the_adapter() -> None:
    """``CaptureOptions(agent_names=...)``: the gateway names each call from its system prompt."""
    rollouts, spans, _ = run(True, adapters=[], agent_names={"calculator": "You are a calculator agent"})
    batch = LightningRL(credit="final", advantage="grpo", agent_match="^calculator$").process(rollouts, spans)
    assert batch.report.reconciliation["calls"] == batch.report.reconciliation["gateway_calls"] == 22
    assert len(batch.transitions) == 22 and {tr.agent_name for tr in batch.transitions} == {"calculator"}
