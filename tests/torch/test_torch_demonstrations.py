"""Demonstrations rendered the way the policy server serves them, and ``TorchSFT(demonstrations=)``:
a scripted teacher's tool calls, recorded by the gateway, make the tiny policy call the tool."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from typing import Any

import pytest
from test_torch_tools import SMOLLM2_TEMPLATE, TOOLS

from agentbolt import types as t
from agentbolt.errors import UserError
from agentbolt.options import RunnerOptions
from agentbolt.store import open_store
from agentbolt.testing.fake_llm import FakeLLM, FakeLLMServer, Rule, ToolCall, ToolCalls
from agentbolt.trainer import Trainer
from agentbolt_torch.chat import parse_tool_calls
from agentbolt_torch.generation.engine import GenerationEngine
from agentbolt_torch.policy import Policy
from agentbolt_torch.serving.server import PolicyServer
from agentbolt_torch.training.demonstrations import (
    Demonstration,
    DemonstrationError,
    demonstrations_from_spans,
    render_demonstration,
    render_demonstrations,
)
from agentbolt_torch.training.sft import TorchSFT

openai = pytest.importorskip("openai")

MESSAGES = [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "What is 3 + 5?"}]
CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {"id": "call_9", "type": "function", "function": {"name": "calculator", "arguments": '{"expression":"3 + 5"}'}}
    ],
}
ANSWER_TURN = [*MESSAGES, CALL, {"role": "tool", "tool_call_id": "call_9", "content": "8"}]


@pytest.fixture(params=["native", "fallback"])
def policy(request: pytest.FixtureRequest, tiny: tuple[Any, Any]) -> Policy:
    """The tiny model with a template that renders tools (native) or SmolLM2's, which does not (fallback)."""
    model, tokenizer = tiny
    if request.param == "fallback":
        tokenizer = copy.deepcopy(tokenizer)
        tokenizer.chat_template = SMOLLM2_TEMPLATE
    return Policy(model, tokenizer, name="tiny", autocast_dtype=None)


def test_prompt_is_the_servers_and_the_reply_parses_back(policy: Policy) -> None:
    demos = [
        Demonstration(messages=MESSAGES, reply=CALL, tools=TOOLS, episode="e", index=0),
        Demonstration(messages=ANSWER_TURN, reply={"role": "assistant", "content": "3 + 5 = 8."}, tools=TOOLS, index=1),
    ]
    with PolicyServer(GenerationEngine(policy, batch_window_s=0.01)) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0)
        for demo in demos:
            tr = render_demonstration(policy.tokenizer, demo)
            served = client.chat.completions.create(
                model="tiny",
                messages=demo.messages,
                tools=demo.tools,
                max_tokens=1,
                extra_body={"return_token_ids": True},
            )
            assert tr.prompt_ids == served.model_extra["prompt_token_ids"]  # what the server builds, token for token
            assert tr.response_ids[-1] in policy.eos_token_ids and tr.token_source == t.TokenSource.RETOKENIZED
            parsed = parse_tool_calls(policy.tokenizer.decode(tr.response_ids[:-1]))
            if demo.reply.get("tool_calls"):
                assert parsed.content is None and len(parsed.tool_calls) == 1
                call = parsed.tool_calls[0]["function"]
                assert call["name"] == "calculator" and json.loads(call["arguments"]) == {"expression": "3 + 5"}
            else:
                assert parsed.content == "3 + 5 = 8." and not parsed.tool_calls


def test_forced_tool_choice_is_prompt_and_bad_replies_are_refused(tiny: tuple[Any, Any]) -> None:
    tokenizer = tiny[1]
    forced = render_demonstration(tokenizer, Demonstration(MESSAGES, CALL, TOOLS, tool_choice="required"))
    free = render_demonstration(tokenizer, Demonstration(MESSAGES, CALL, TOOLS))
    assert tokenizer.decode(forced.prompt_ids).endswith('<tool_call>\n{"name":')  # the forced start is prompt
    assert len(forced.response_ids) < len(free.response_ids)
    with pytest.raises(DemonstrationError, match="offered none"):
        render_demonstration(tokenizer, Demonstration(MESSAGES, CALL, tools=None))
    with pytest.raises(DemonstrationError, match="offered none"):
        render_demonstration(tokenizer, Demonstration(MESSAGES, CALL, TOOLS, tool_choice="none"))
    other = {"type": "function", "function": {"name": "other"}}
    with pytest.raises(UserError, match="not one of the tools"):
        render_demonstration(tokenizer, Demonstration(MESSAGES, CALL, TOOLS, tool_choice=other))
    kept, skipped = render_demonstrations(
        tokenizer, [Demonstration(MESSAGES, CALL, TOOLS), Demonstration(MESSAGES, CALL, None)], max_len=10_000
    )
    assert len(kept) == 1 and skipped == {
        "the reply calls a tool but the request offered none (the server would not parse it)": 1
    }
    _, too_long = render_demonstrations(tokenizer, [Demonstration(MESSAGES, CALL, TOOLS)], max_len=20)
    assert too_long == {"longer than the context (20 tokens)": 1}


async def tool_agent(task: dict[str, Any], resources: t.Resources) -> float:
    """Asks with the calculator offered; 1.0 when the reply calls it with the task's expression."""
    client = openai.AsyncOpenAI(base_url=resources.llm.base_url, api_key="none", max_retries=0)
    try:
        reply = await client.chat.completions.create(
            model=resources.llm.model,
            messages=[{"role": "system", "content": "Use tools."}, {"role": "user", "content": task["question"]}],
            tools=TOOLS,
        )
    finally:
        await client.close()
    calls = reply.choices[0].message.tool_calls or []
    ok = calls and calls[0].function.name == "calculator" and json.loads(calls[0].function.arguments) == task["call"]
    return 1.0 if ok else 0.0


async def _demonstrations(url: str) -> list[Demonstration]:
    store = open_store(url)
    try:
        rollouts = (await store.query_rollouts(limit=100)).items
        spans = await store.query_spans([r.rollout_id for r in rollouts], latest_attempt_only=True)
    finally:
        await store.close()
    return demonstrations_from_spans(rollouts, spans, threshold=1.0)


def test_teacher_calls_become_demonstrations_that_teach_the_served_policy_the_tool(tmp_path: Path) -> None:
    task = {"task_id": "q", "question": "What is 3 + 5?", "call": {"expression": "3 + 5"}}
    miss = {"task_id": "miss", "question": "What is 2 + 2?", "call": {"expression": "2 + 2"}}
    teacher = FakeLLM(rules=[Rule(reply=ToolCalls([ToolCall("calculator", {"expression": "3 + 5"})]))])
    store = f"sqlite:///{tmp_path / 'teacher.db'}"
    with FakeLLMServer(teacher) as server:
        Trainer(tool_agent, store=store, runners=RunnerOptions(n=0), progress=False).dev(
            [task, miss], llm=server.base_url
        )
    demos = asyncio.run(_demonstrations(store))
    # the teacher's successful rollout only (it called 2 + 2 wrong), as the agent sent and received it
    assert len(demos) == 1 and demos[0].task_id == "q" and demos[0].tools == TOOLS
    assert demos[0].messages[-1]["content"] == "What is 3 + 5?"
    assert demos[0].reply["tool_calls"][0]["function"]["name"] == "calculator"

    sft = TorchSFT(
        "tiny",
        demonstrations=demos,
        steps=25,
        batch_size=1,
        sampling={"max_tokens": 96},
        evaluation={"temperature": 0.0, "every": None},
        generation={"engine": {"batch_window_s": 0.01}},
        output={"out_dir": tmp_path / "out"},
        update={"lr": 3e-3},
    )
    result = Trainer(tool_agent, sft, store="memory://", runners=RunnerOptions(n=0), progress=False).fit([], [task])
    # the random policy never calls the tool; after SFT on the rendered demonstration, the served
    # policy's reply parses into exactly the taught call
    assert result.accuracy_before == 0.0 and result.accuracy_after == 1.0
    records = [json.loads(line) for line in Path(result.metrics_path).read_text().splitlines()]
    steps = [r for r in records if "update/loss" in r]
    assert len(steps) == 25 and all(r["train/episodes"] == 1 and r["train/skipped_calls"] == 0 for r in steps)
    assert steps[-1]["update/loss"] < steps[0]["update/loss"]


def test_validates_demonstrations() -> None:
    with pytest.raises(UserError, match="demonstrations is empty"):
        TorchSFT("tiny", demonstrations=[])
