"""``agentbolt export --format atif|chat-jsonl``: a run's rollouts as ATIF v1.8 trajectories
(validated and read back with the ``atif`` package's models) and as chat JSONL, for rollouts the
gateway recorded and for traced rollouts (instrumentation spans only, no token ids)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import atif
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.cli import app
from agentbolt.errors import UserError
from agentbolt.options import RunnerOptions
from agentbolt.runs.atif_export import read_atif, rollout_trajectory, trajectory_calls, trajectory_reward
from agentbolt.runs.chat_calls import normalize_message, rollout_chat_calls, select_rollouts
from agentbolt.store import open_store
from agentbolt.testing.fake_llm import FakeLLM, FakeLLMServer, FakeRequest, Rule, ToolCall, ToolCalls
from agentbolt.trainer import Trainer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calc",
            "description": "Evaluate arithmetic",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]
FEW_SHOT = [
    {"role": "system", "content": "Answer with <answer>N</answer>."},
    {"role": "user", "content": "What is 1 + 1?"},
    {"role": "assistant", "content": "<answer>2</answer>"},
]


def _reply(req: FakeRequest) -> Any:
    """The calculator first, then the answer the tool gave (wrong for questions with a 9)."""
    messages = req.messages or []
    if messages[-1]["role"] == "tool":
        return f"The answer is <answer>{messages[-1]['content']}</answer>."
    question = messages[-1]["content"]
    expression = question.removeprefix("What is ").rstrip("?")
    return ToolCalls([ToolCall("calc", {"expression": expression})])


async def tool_agent(task: dict[str, Any], resources: t.Resources) -> float:
    assert resources.llm is not None
    client = openai.AsyncOpenAI(base_url=resources.llm.base_url, api_key="none", max_retries=0)
    messages: list[dict[str, Any]] = [*FEW_SHOT, {"role": "user", "content": task["question"]}]
    try:
        for _ in range(3):
            reply = await client.chat.completions.create(model=resources.llm.model, messages=messages, tools=TOOLS)
            message = reply.choices[0].message
            if not message.tool_calls:
                break
            messages.append(message.model_dump(exclude_none=True))
            for call in message.tool_calls:
                expression = json.loads(call.function.arguments)["expression"]
                value = eval(expression, {"__builtins__": {}})  # the test's own expressions only
                value = value + 1 if "9" in expression else value
                messages.append({"role": "tool", "tool_call_id": call.id, "content": str(value)})
    finally:
        await client.close()
    return 1.0 if f"<answer>{task['answer']}</answer>" in (message.content or "") else 0.0


TASKS = [
    {"task_id": "a", "question": "What is 3 + 5?", "answer": 8},
    {"task_id": "b", "question": "What is 9 + 4?", "answer": 13},
    {"task_id": "c", "question": "What is 7 - 2?", "answer": 5},
]


@pytest.fixture(scope="module")
def gateway_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """``(store url, run id)``: the tool agent on the fake LLM through the gateway, 2 samples per task."""
    url = f"sqlite:///{tmp_path_factory.mktemp('atif') / 'runs.db'}"
    with FakeLLMServer(FakeLLM(rules=[Rule(reply=_reply)])) as server:
        Trainer(tool_agent, store=url, runners=RunnerOptions(n=0), progress=False).dev(
            TASKS, llm=server.base_url, n_samples=2
        )

    async def run_id() -> str:
        store = open_store(url)
        try:
            return (await store.list_runs(limit=1))[0].run_id
        finally:
            await store.close()

    return url, asyncio.run(run_id())


async def _rollouts(url: str, run_id: str) -> tuple[list[t.Rollout], dict[str, list[t.Span]]]:
    from agentbolt.store import RolloutSearch

    store = open_store(url)
    try:
        rollouts = (await store.search_rollouts(RolloutSearch(run_id=run_id, limit=100))).items
        spans = await store.query_spans([r.rollout_id for r in rollouts], latest_attempt_only=True)
    finally:
        await store.close()
    return list(rollouts), {k: list(v) for k, v in spans.items()}


def _export(url: str, run_id: str, out: Path, *extra: str) -> str:
    result = CliRunner().invoke(app, ["export", "--run", run_id, "--store", url, "-o", str(out), *extra])
    assert result.exit_code == 0, result.output
    return result.stderr


def _same_call(got: Any, call: Any) -> None:
    """An ATIF agent step read back is the recorded call: the same request and the same reply."""
    assert [normalize_message(m) for m in got.messages] == [normalize_message(m) for m in call.messages]
    assert normalize_message(got.reply) == normalize_message(call.reply)
    assert got.tools == call.tools
    assert got.completion_ids == call.response_ids and got.prompt_ids == call.prompt_ids
    assert got.logprobs == call.response_logprobs


def test_atif_export_validates_and_reads_back_to_the_recorded_calls(
    gateway_store: tuple[str, str], tmp_path: Path
) -> None:
    url, run_id = gateway_store
    out = tmp_path / "run.atif.jsonl"
    err = _export(url, run_id, out, "--format", "atif", "--mode", "all")
    trajectories = read_atif(out)  # every line validated by atif.Trajectory
    rollouts, spans = asyncio.run(_rollouts(url, run_id))
    assert len(trajectories) == len(rollouts) == 6 and "exported 6 ATIF trajectories" in err
    by_id = {r.rollout_id: r for r in rollouts}
    for trajectory in trajectories:
        assert trajectory.schema_version == "ATIF-v1.8"
        rollout = by_id[trajectory.session_id or ""]
        assert trajectory_reward(trajectory) == rollout.final_reward  # the reward survives
        calls = rollout_chat_calls(rollout, spans[rollout.rollout_id])
        got = trajectory_calls(trajectory)
        assert len(calls) == len(got) == 2  # tool call, then the answer
        for g, c in zip(got, calls, strict=True):
            _same_call(g, c)
            assert c.token_source == t.TokenSource.EXACT and c.response_logprobs  # the gateway's exact ids
        steps = trajectory.steps
        # system, user, few-shot reply (copied context), user, tool-call step (+ observation), answer
        assert [s.source for s in steps] == ["system", "user", "agent", "user", "agent", "agent"]
        assert steps[2].is_copied_context and steps[2].llm_call_count == 0
        call_step = steps[4]
        assert call_step.tool_calls and call_step.tool_calls[0].function_name == "calc"
        assert call_step.observation is not None
        assert call_step.observation.results[0].source_call_id == call_step.tool_calls[0].tool_call_id
        assert trajectory.agent.tool_definitions == TOOLS
        # and the document is valid ATIF by the atif package's own model, dumped and loaded again
        again = atif.Trajectory.model_validate_json(json.dumps(trajectory.to_json_dict()))
        assert again == trajectory


def test_chat_jsonl_filters_by_reward_and_best_k(gateway_store: tuple[str, str], tmp_path: Path) -> None:
    url, run_id = gateway_store
    rollouts, _ = asyncio.run(_rollouts(url, run_id))
    every = tmp_path / "all.jsonl"
    _export(url, run_id, every, "--format", "chat-jsonl", "--mode", "all")
    records = [json.loads(line) for line in every.read_text().splitlines()]
    assert len(records) == 2 * len(rollouts)  # two calls per rollout
    assert all(r["messages"][-1]["role"] == "assistant" and r["tools"] == TOOLS for r in records)

    best = tmp_path / "best.jsonl"
    err = _export(url, run_id, best, "--format", "chat-jsonl", "--mode", "all", "--min-reward", "1", "--best-k", "1")
    kept = [json.loads(line) for line in best.read_text().splitlines()]
    passing = {r.task_id for r in rollouts if r.final_reward == 1.0}
    assert passing == {"a", "c"}  # the calculator is wrong on 9 + 4
    assert {r["task_id"] for r in kept} == passing and len({r["rollout_id"] for r in kept}) == len(passing)
    assert all(r["reward"] == 1.0 for r in kept)
    assert "2 rollouts final reward below 1 or none" in err and "2 rollouts beyond the best 1 of their task" in err

    datasets = pytest.importorskip("datasets")
    ds = datasets.load_dataset("json", data_files=str(best), split="train")
    assert ds.num_rows == len(kept) and "messages" in ds.column_names


def test_the_trace_marker_is_the_ingestions() -> None:
    from agentbolt.runs.chat_calls import TRACE_SOURCE_KEY, RolloutSource, rollout_source
    from agentbolt.traces import META_SOURCE

    assert TRACE_SOURCE_KEY == META_SOURCE
    marked = t.Rollout(rollout_id="r", metadata={META_SOURCE: "trace"})
    assert rollout_source(marked, []) is RolloutSource.traces


def test_the_exports_read_the_trace_marker_without_the_ingestor() -> None:
    """The marker has one definition (agentbolt.traces.metadata): reading it costs no ingestor,
    store or receivers."""
    code = (
        "import sys, agentbolt.runs.chat_calls\n"
        "print(sorted(m for m in sys.modules if m.startswith(('agentbolt.traces.', 'agentbolt.store'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['agentbolt.traces.messages', 'agentbolt.traces.metadata']"


def test_source_filter_tells_gateway_rollouts_from_traced_ones(gateway_store: tuple[str, str], tmp_path: Path) -> None:
    url, run_id = gateway_store
    out = tmp_path / "traces.jsonl"
    err = _export(url, run_id, out, "--format", "atif", "--mode", "all", "--source", "traces")
    assert out.read_text() == "" and "6 rollouts not from traces" in err
    err = _export(url, run_id, out, "--format", "atif", "--mode", "all", "--source", "gateway")
    assert len(out.read_text().splitlines()) == 6


BIG = 2**70 + 1
"""An integer beyond 64 bits (orjson cannot write it) in a tool call's arguments."""


def _big_reply(req: FakeRequest) -> Any:
    messages = req.messages or []
    if messages[-1]["role"] == "tool":
        return f"The answer is <answer>{messages[-1]['content']}</answer>."
    return ToolCalls([ToolCall("calc", f'{{"expression": "3 + 5", "seed": {BIG}}}')])


def test_every_format_exports_an_integer_beyond_64_bits(tmp_path: Path) -> None:
    """A tool call whose arguments hold an integer beyond 64 bits exports in every format (the
    trajectory and the chat calls keep it exactly)."""
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    with FakeLLMServer(FakeLLM(rules=[Rule(reply=_big_reply)])) as server:
        Trainer(tool_agent, store=url, runners=RunnerOptions(n=0), progress=False).dev(TASKS[:1], llm=server.base_url)

    async def run_id() -> str:
        store = open_store(url)
        try:
            return (await store.list_runs(limit=1))[0].run_id
        finally:
            await store.close()

    rid = asyncio.run(run_id())
    for fmt in ("jsonl", "otlp", "sft-jsonl", "chat-jsonl", "atif"):
        out = tmp_path / f"big.{fmt}"
        _export(url, rid, out, "--format", fmt, "--mode", "all")
        lines = out.read_text().splitlines()
        assert lines and all(json.loads(line) for line in lines), fmt
        if fmt != "jsonl":  # transitions carry token ids, not the messages
            assert str(BIG) in out.read_text(), fmt
    (trajectory,) = read_atif(tmp_path / "big.atif")
    (call, _answer) = trajectory_calls(trajectory)
    assert json.loads(call.reply["tool_calls"][0]["function"]["arguments"]) == {"expression": "3 + 5", "seed": BIG}


# --- traced rollouts: instrumentation spans only ------------------------------------------------


def _parts(message: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI chat message in the OpenTelemetry GenAI ``parts`` form (OpenLLMetry 0.50+)."""
    if message["role"] == "tool":
        part = {"type": "tool_call_response", "id": message["tool_call_id"], "response": message["content"]}
        return {"role": "tool", "parts": [part]}
    parts: list[dict[str, Any]] = []
    if message.get("content") is not None:
        parts.append({"type": "text", "content": message["content"]})
    for call in message.get("tool_calls") or []:
        fn = call["function"]
        parts.append(
            {"type": "tool_call", "id": call["id"], "name": fn["name"], "arguments": json.loads(fn["arguments"])}
        )
    return {"role": message["role"], "parts": parts}


def _flat(messages: list[dict[str, Any]], which: str) -> dict[str, Any]:
    """OpenAI chat messages flattened into ``gen_ai.{prompt,completion}.{i}.*`` (AgentOps, OpenLLMetry
    before the GenAI message attributes)."""
    attrs: dict[str, Any] = {}
    for i, message in enumerate(messages):
        for key in ("role", "content", "tool_call_id"):
            if message.get(key) is not None:
                attrs[f"gen_ai.{which}.{i}.{key}"] = message[key]
        for j, call in enumerate(message.get("tool_calls") or []):
            for key, value in (("id", call["id"]), *call["function"].items()):
                attrs[f"gen_ai.{which}.{i}.tool_calls.{j}.{key}"] = value
    return attrs


def _recorded(messages: list[dict[str, Any]], reply: dict[str, Any], shape: str) -> dict[str, Any]:
    """A call's messages and the tools it offered (:data:`TOOLS`) as an instrumentation records them."""
    if shape == "openai":  # OpenInference through its adapter
        schemas = {f"llm.tools.{i}.tool.json_schema": json.dumps(tool) for i, tool in enumerate(TOOLS)}
        return {
            semconv.GEN_AI_INPUT_MESSAGES: json.dumps(messages),
            semconv.GEN_AI_OUTPUT_MESSAGES: json.dumps([reply]),
            **schemas,
        }
    if shape == "parts":
        return {
            semconv.GEN_AI_INPUT_MESSAGES: json.dumps([_parts(m) for m in messages]),
            semconv.GEN_AI_OUTPUT_MESSAGES: json.dumps([_parts(reply)]),
            "gen_ai.tool.definitions": json.dumps([{"type": "function", **tool["function"]} for tool in TOOLS]),
        }
    functions = {
        f"llm.request.functions.{i}.{key}": value if isinstance(value, str) else json.dumps(value)
        for i, tool in enumerate(TOOLS)
        for key, value in tool["function"].items()
    }
    return {**_flat(messages, "prompt"), **_flat([reply], "completion"), **functions}


def traced_rollout(
    turns: list[tuple[list[dict[str, Any]], dict[str, Any]]],
    reward: float | None = 1.0,
    rollout_id: str = "r1",
    shape: str | None = None,
) -> tuple[t.Rollout, list[t.Span]]:
    """A rollout as ingestion stores a trace: OpenInference-style LLM spans translated to GenAI
    attributes (messages, model, usage), no token ids, no logprobs. With ``shape`` (``openai``,
    ``parts``, ``flat``) the messages and :data:`TOOLS` are recorded as that instrumentation does."""
    rollout = t.Rollout(
        rollout_id=rollout_id,
        task_id="task",
        status=t.RolloutStatus.SUCCEEDED,
        final_reward=reward,
        current_attempt_id="at1",
    )
    spans = []
    for i, (messages, reply) in enumerate(turns):
        spans.append(
            t.Span(
                rollout_id=rollout_id,
                attempt_id="at1",
                seq=i,
                trace_id="0" * 31 + "1",
                span_id=f"{i + 1:016x}",
                name="ChatCompletion",
                start_time_ns=1_700_000_000_000_000_000 + i,
                end_time_ns=1_700_000_000_000_000_001 + i,
                attributes={
                    semconv.GEN_AI_OPERATION_NAME: semconv.OP_CHAT,
                    semconv.GEN_AI_REQUEST_MODEL: "prod-model",
                    **(
                        _recorded(messages, reply, shape)
                        if shape is not None
                        else {
                            semconv.GEN_AI_INPUT_MESSAGES: json.dumps(messages),
                            semconv.GEN_AI_OUTPUT_MESSAGES: json.dumps([reply]),
                        }
                    ),
                    semconv.GEN_AI_USAGE_INPUT_TOKENS: 10 + i,
                    semconv.GEN_AI_USAGE_OUTPUT_TOKENS: 3,
                },
            )
        )
    return rollout, spans


def test_a_traced_rollout_without_token_ids_exports_and_reads_back() -> None:
    question = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}]
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}
        ],
    }
    second = [*question, call, {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    answer = {"role": "assistant", "content": "Sunny."}
    # a second agent with a fresh context (not a continuation of the first conversation)
    other = [{"role": "user", "content": "Summarize: Sunny."}]
    rollout, spans = traced_rollout(
        [(question, call), (second, answer), (other, {"role": "assistant", "content": "ok"})]
    )
    calls = rollout_chat_calls(rollout, spans)
    assert [c.token_source for c in calls] == [t.TokenSource.MISSING] * 3 and calls[0].response_logprobs is None
    trajectory = rollout_trajectory(rollout, spans)
    got = trajectory_calls(atif.Trajectory.model_validate(trajectory.to_json_dict()))
    assert len(got) == 3
    for g, c in zip(got, calls, strict=True):
        assert [normalize_message(m) for m in g.messages] == [normalize_message(m) for m in c.messages]
        assert normalize_message(g.reply) == normalize_message(c.reply)
        assert g.completion_ids is None and g.model_name == "prod-model"
    assert trajectory.steps[-2].extra == {"agentbolt": {"context": "new"}}  # the second agent's first message
    assert trajectory.final_metrics is not None and trajectory.final_metrics.total_prompt_tokens == 10 + 11 + 12


def test_a_rollout_without_messages_is_refused_and_bad_atif_is_named(tmp_path: Path) -> None:
    rollout = t.Rollout(rollout_id="empty", status=t.RolloutStatus.SUCCEEDED, current_attempt_id="at1")
    with pytest.raises(UserError, match="no LLM call with recorded messages"):
        rollout_trajectory(rollout, [])
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"schema_version": "ATIF-v1.8", "agent": {"name": "x", "version": "1"}, "steps": [{"step_id": 2, '
        '"source": "user", "message": "hi"}]}\n'
    )
    with pytest.raises(UserError, match=r"bad.jsonl:1 is not a valid ATIF trajectory"):
        read_atif(bad)


_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=20)
_args = st.dictionaries(st.text("abcxyz", min_size=1, max_size=4), st.integers() | _text, max_size=3)


@st.composite
def conversations(draw: st.DrawFn) -> list[tuple[list[dict[str, Any]], dict[str, Any]]]:
    """A multi-call conversation: each call's prompt continues the last one (reply and tool results)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": draw(_text)},
        {"role": "user", "content": draw(_text)},
    ]
    turns = []
    for i in range(draw(st.integers(1, 4))):
        n_calls = draw(st.integers(0, 2))
        calls = [
            {
                "id": f"c{i}_{j}",
                "type": "function",
                "function": {"name": draw(st.sampled_from(["f", "g"])), "arguments": json.dumps(draw(_args))},
            }
            for j in range(n_calls)
        ]
        reply: dict[str, Any] = {"role": "assistant", "content": draw(_text) or None}
        if calls:
            reply["tool_calls"] = calls
        turns.append((list(messages), reply))
        messages.append(reply)
        messages.extend({"role": "tool", "tool_call_id": c["id"], "content": draw(_text)} for c in calls)
        if draw(st.booleans()):
            messages.append({"role": "user", "content": draw(_text)})
    return turns


@settings(max_examples=60, deadline=None)
@given(turns=conversations(), reward=st.none() | st.floats(-5, 5))
def test_any_conversation_round_trips_through_atif(turns: list[Any], reward: float | None) -> None:
    """Invariant: export -> JSON -> atif.Trajectory -> chat calls gives back every call's request,
    reply and tool calls, and the reward."""
    rollout, spans = traced_rollout(turns, reward=reward)
    trajectory = rollout_trajectory(rollout, spans)
    loaded = atif.Trajectory.model_validate_json(json.dumps(trajectory.to_json_dict()))
    got = trajectory_calls(loaded)
    assert len(got) == len(turns)
    for g, (messages, reply) in zip(got, turns, strict=True):
        assert [normalize_message(m) for m in g.messages] == [normalize_message(m) for m in messages]
        assert normalize_message(g.reply) == normalize_message(reply)
    assert trajectory_reward(loaded) == reward


@settings(max_examples=40, deadline=None)
@given(turns=conversations(), shape=st.sampled_from(["openai", "parts", "flat"]))
def test_every_instrumentation_shape_reads_as_the_same_calls(turns: list[Any], shape: str) -> None:
    """Invariant: whether the instrumentation recorded OpenAI messages (OpenInference), GenAI
    ``parts`` (OpenLLMetry 0.50+) or flattened ``gen_ai.prompt.{i}.*`` attributes (AgentOps), every
    call reads back as the request it sent (in OpenAI's shape), its reply and the tools it offered,
    and exports to ATIF and back the same."""
    rollout, spans = traced_rollout(turns, shape=shape)
    calls = rollout_chat_calls(rollout, spans)
    assert len(calls) == len(turns)
    for call, (messages, reply) in zip(calls, turns, strict=True):
        assert all("parts" not in m for m in [*call.messages, call.reply])
        assert [normalize_message(m) for m in call.messages] == [normalize_message(m) for m in messages]
        assert normalize_message(call.reply) == normalize_message(reply) and call.tools == TOOLS
    got = trajectory_calls(
        atif.Trajectory.model_validate_json(json.dumps(rollout_trajectory(rollout, spans).to_json_dict()))
    )
    assert [(normalize_message(g.reply), g.tools) for g in got] == [(normalize_message(r), TOOLS) for _, r in turns]


def test_select_rollouts_keeps_the_best_per_task() -> None:
    def r(i: int, task: str, reward: float | None) -> t.Rollout:
        return t.Rollout(rollout_id=f"r{i}", task_id=task, final_reward=reward)

    rollouts = [r(0, "a", 0.5), r(1, "a", 1.0), r(2, "a", 1.0), r(3, "b", None), r(4, "b", 0.2)]
    assert [x.rollout_id for x in select_rollouts(rollouts, min_reward=0.5)] == ["r0", "r1", "r2"]
    assert [x.rollout_id for x in select_rollouts(rollouts, best_k=1)] == ["r1", "r4"]
    assert [x.rollout_id for x in select_rollouts(rollouts, min_reward=0.5, best_k=2)] == ["r1", "r2"]
    with pytest.raises(UserError, match="best_k must be at least 1"):
        select_rollouts(rollouts, best_k=0)
