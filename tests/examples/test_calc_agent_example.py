"""examples/calc_agent: the demonstrations -> SFT -> GRPO pipeline end to end (tiny model, runner
processes, SQLite; chain demonstrations and a scripted --teacher), the agent's tool path, its
Calc-X loader on fixture files, and its safe calculator (the data's held-out guarantees:
test_calc_agent_data.py).

The example's modules (agent.py, data.py, ...) share names with the other examples', so the
end-to-end runs happen in subprocesses and the loader/calculator are imported under unique names.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.lightningrl import LightningRL
from agentbolt.store import open_store

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "calc_agent"
FIXTURES = Path(__file__).parent / "fixtures" / "calc_agent"


def load_module(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"calc_agent_example_{name}", EXAMPLE / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


baselines = load_module("baselines")
data = baselines.load_siblings()["data"]  # data.py imports its siblings (bundled, chains)
calculator = load_module("calculator")


# -- end to end -----------------------------------------------------------------------------------


async def _store_contents(url: str) -> tuple[list[t.Rollout], dict[str, list[t.Span]]]:
    store = open_store(url)
    try:
        rollouts = (await store.query_rollouts(limit=10_000)).items
        spans = await store.query_spans([r.rollout_id for r in rollouts], latest_attempt_only=True)
    finally:
        await store.close()
    return rollouts, spans


def _train(tmp_path: Path, *args: str, timeout: float = 840) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            str(EXAMPLE / "train.py"),
            *("--model", "tiny", "--no-progress", "--batch-size", "2", "--group-size", "2", "--max-tokens", "32"),
            *("--store", f"sqlite:///{tmp_path / 'calc.db'}", "--out", str(tmp_path / "out")),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


@pytest.mark.timeout(900)  # three tiny-model stages in runner processes; slow on a busy 2-core machine
def test_pipeline_demonstrations_sft_rl_writes_the_run_record(tmp_path: Path) -> None:
    proc = _train(
        tmp_path,
        *("--demos", "6", "--sft-steps", "2", "--sft-batch-size", "3", "--rl-steps", "1", "--val", "3"),
        *("--record", str(tmp_path / "record")),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "demonstrations: 6 of 6 problems solved" in proc.stdout
    assert "LLMCall" not in proc.stderr  # AutoGen's per-call event log stays off the console
    for name in ("result.json", "metrics.jsonl", "curve.png"):
        assert (tmp_path / "record" / name).read_bytes() == (tmp_path / "out" / name).read_bytes()
    result = json.loads((tmp_path / "out/result.json").read_text())
    # the examples' shared record format (RECORDS.md)
    assert result["example"] == "calc_agent" and result["headline"] == "large/accuracy" and result["steps"] == 3
    assert result["command"].startswith("uv run python examples/calc_agent/train.py --model tiny")
    assert {"commit", "date", "machine", "model", "wall_s", "s_per_step"} <= set(result)
    assert set(result["heldout"]) == {"small", "large"}
    for entry in result["heldout"].values():
        assert entry["metric"] == "accuracy" and entry["n"] == 3 and list(entry["stages"]) == ["base", "sft", "rl"]
        assert entry["before"] == entry["stages"]["base"]["score"] and entry["after"] == entry["stages"]["rl"]["score"]
        for figures in entry["stages"].values():
            assert set(figures) == {"score", "se", "tool_call_rate"} and 0 <= figures["tool_call_rate"] <= 1
            assert figures["se"] == pytest.approx(math.sqrt(figures["score"] * (1 - figures["score"]) / 3))
    demos = result["extra"]["demonstrations"]
    assert demos["teacher"] == "calc-x-chains" and demos["solved"] == 6 and demos["tool_calls"] >= 6
    records = [json.loads(line) for line in (tmp_path / "out/metrics.jsonl").read_text().splitlines()]
    sft = [r for r in records if r.get("stage") == "sft" and "update/loss" in r]
    # every demonstrated call renders for the tiny model's tokenizer: nothing skipped
    assert len(sft) == 2 and all(r["train/episodes"] == 3 and r["train/skipped_calls"] == 0 for r in sft)
    assert [r for r in records if r.get("stage") == "rl" and "train/reward" in r]
    heldout = [(r["stage"], r["tier"]) for r in records if r.get("kind") == "heldout"]
    assert heldout == [(s, t) for s in ("base", "sft", "rl") for t in ("large", "small")]
    # one step axis over the stages (the docs/runs contract): SFT steps 1-2, RL step 3
    assert set(range(1, result["steps"] + 1)) <= {r["step"] for r in records}
    assert [r["step"] for r in records if r.get("kind") == "heldout"] == [0, 0, 2, 2, 3, 3]
    assert [(r["step"], r["stage_step"]) for r in records if r.get("stage") == "rl" and "train/reward" in r] == [(3, 1)]

    # the RL run's rollouts: every LLM call the gateway recorded became a transition or an exclusion
    rollouts, spans = asyncio.run(_store_contents(f"sqlite:///{tmp_path / 'calc.db'}"))
    train = [r for r in rollouts if r.mode is t.RolloutMode.TRAIN]
    assert len(train) == 2 * 2 and all(r.status is t.RolloutStatus.SUCCEEDED for r in train)
    step_spans = {r.rollout_id: spans[r.rollout_id] for r in train}
    llm_calls = sum(semconv.TOKEN_SOURCE in s.attributes for ss in step_spans.values() for s in ss)
    report = LightningRL(credit="final", advantage="grpo", allow_empty=True).process(train, step_spans).report
    assert llm_calls == report.calls >= len(train)
    assert report.trained_calls + sum(report.excluded.values()) == report.calls, report.summary()


TEACHER = """
import json, sys, time
sys.path.insert(0, {example!r})
from data import load
from chains import chain_steps
from agentbolt.testing.fake_llm import FakeLLM, FakeLLMServer, Rule, ToolCall, ToolCalls

train, _ = load()
one_step = {{t["question"]: chain_steps(t["chain"])[0].expression for t in train[:6] if len(chain_steps(t["chain"])) == 1}}
wrong = next(iter(one_step))  # the scripted teacher gets this one wrong: its rollout is not kept

def question(r):
    return [m for m in r.messages if m["role"] == "user"][-1]["content"]

backend = FakeLLM(rules=[
    Rule(match=lambda r: r.messages[-1]["role"] == "tool",
         reply=lambda r: "<answer>" + r.messages[-1]["content"] + ("1" if question(r) == wrong else "") + "</answer>"),
    Rule(match=lambda r: question(r) in one_step,
         reply=lambda r: ToolCalls([ToolCall("calculator", {{"expression": one_step[question(r)]}})])),
    Rule(reply="I do not know."),
])
with FakeLLMServer(backend) as server:
    print(json.dumps({{"url": server.base_url, "solvable": len(one_step) - 1}}), flush=True)
    sys.stdin.readline()
"""


@pytest.mark.timeout(900)  # a scripted teacher and a tiny-model SFT stage; slow on a busy 2-core machine
def test_teacher_demonstrations_come_from_its_successful_rollouts(tmp_path: Path) -> None:
    """``--teacher URL``: a scripted OpenAI-compatible teacher (standing for a stronger model) answers
    with calculator calls; only the rollouts it got right become demonstrations."""
    teacher = subprocess.Popen(
        [sys.executable, "-c", TEACHER.format(example=str(EXAMPLE))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert teacher.stdout is not None
        info = json.loads(teacher.stdout.readline())
        proc = _train(
            tmp_path,
            *("--teacher", info["url"], "--teacher-model", "fake-model", "--demos", "6"),
            *("--sft-steps", "1", "--rl-steps", "0", "--val", "2"),
        )
    finally:
        teacher.kill()
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "out/result.json").read_text())
    demos = result["extra"]["demonstrations"]
    assert demos["teacher"] == info["url"] and demos["problems"] == 6
    # the one-step problems it answers right, two calls each (the calculator call, then the answer)
    assert demos["solved"] == info["solvable"] >= 1 and demos["calls"] == 2 * demos["solved"]
    assert demos["tool_calls"] == demos["solved"]
    assert all(list(entry["stages"]) == ["base", "sft"] for entry in result["heldout"].values())


FAKE_RUN = """
import asyncio, json, sys
sys.path.insert(0, {example!r})
from agent import calc_agent
from figures import calls_tool
from agentbolt.lightningrl import LightningRL
from agentbolt.store import open_store
from agentbolt.testing.fake_llm import FakeLLM, FakeLLMServer, Rule, ToolCall, ToolCalls
from agentbolt.trainer import Trainer

backend = FakeLLM(rules=[
    Rule(match=lambda r: r.messages[-1]["role"] == "tool",
         reply=lambda r: "The result is " + r.messages[-1]["content"] + ". <answer>" + r.messages[-1]["content"] + "</answer>"),
    Rule(match=lambda r: "marbles" in r.text, reply="<answer>3</answer>"),
    Rule(reply=ToolCalls([ToolCall("calculator", {{"expression": "7 * 8"}})])),
])
tasks = [
    {{"task_id": "tool", "question": "Ben buys 7 bags with 8 shells in each bag. How many shells is that?", "answer": 56}},
    {{"task_id": "direct", "question": "Ann has 2 marbles and gets 2 more. How many marbles?", "answer": 4}},
]
url = "sqlite:///" + {db!r}
with FakeLLMServer(backend) as server:
    Trainer(calc_agent, store=url, runners={{"n": 0}}, progress=False).dev(tasks, llm=server.base_url, model="fake-model")

async def main():
    store = open_store(url)
    rollouts = (await store.query_rollouts(limit=100)).items
    spans = await store.query_spans([r.rollout_id for r in rollouts], latest_attempt_only=True)
    await store.close()
    batch = LightningRL(credit="final", advantage="grpo", allow_empty=True).process(rollouts, spans)
    out = {{}}
    for r in rollouts:
        mine = [tr for tr in batch.transitions if tr.rollout_id == r.rollout_id]
        out[r.task_id] = {{"reward": r.final_reward, "tool": calls_tool(spans[r.rollout_id]),
                          "transitions": len(mine), "agents": sorted({{tr.agent_name for tr in mine}})}}
    print(json.dumps(out))

asyncio.run(main())
"""


def test_agent_calls_the_calculator_and_the_tool_use_is_counted(tmp_path: Path) -> None:
    """The agent's tool path against a scripted backend: tool call, reflection, reward; and a direct answer."""
    code = textwrap.dedent(FAKE_RUN.format(example=str(EXAMPLE), db=str(tmp_path / "fake.db")))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # 7 * 8 through the calculator, then the reflection call answers from its result: two calls trained
    assert out["tool"] == {"reward": 1.0, "tool": True, "transitions": 2, "agents": ["solver"]}
    # a direct (wrong) answer: one call, no tool, the format-only reward
    assert out["direct"] == {"reward": 0.1, "tool": False, "transitions": 1, "agents": ["solver"]}


# -- the Calc-X loader ----------------------------------------------------------------------------


def test_loader_reads_calc_x_jsonl_and_skips_non_numeric_results() -> None:
    train = data.read_records(FIXTURES / "train.jsonl")
    assert [r["task_id"] for r in train] == ["gsm8k__aBNKNcEjjI9JWsV4", "ape210k__00377591", "mawps__xUz7fmTYwbZ8Li9C"]
    assert [r["answer"] for r in train] == [72.0, 0.375, 11.5]  # "3/4"-style fractions become numbers
    assert train[0]["source"] == "gsm8k" and train[0]["question"].startswith("Natalia sold clips")


def test_loader_finds_the_splits_of_a_folder(tmp_path: Path) -> None:
    train, tiers = data.load(FIXTURES)  # test.jsonl: one tier, "test"
    assert len(train) == 3 and [r["answer"] for r in tiers["test"]] == [51.0, 9.0] and list(tiers) == ["test"]
    assert len(data.load(FIXTURES, n_val=1)[1]["test"]) == 1


def test_loader_reads_the_parquet_release_layout(tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    (tmp_path / "data").mkdir()
    for split in ("train", "validation"):
        rows = [json.loads(line) for line in (FIXTURES / "train.jsonl").read_text().splitlines()]
        pq.write_table(pa.Table.from_pylist(rows), tmp_path / "data" / f"{split}-00000-of-00001-abc.parquet")
    train = data.load_split(tmp_path, "train")
    held_out = data.load_tiers(tmp_path)  # no test split: validation is the held-out one (same rows here)
    assert [r["answer"] for r in train] == [r["answer"] for r in held_out["validation"]] == [72.0, 0.375, 11.5]


def test_loader_errors_name_file_and_line(tmp_path: Path) -> None:
    with pytest.raises(data.DataError, match=r"malformed\.jsonl:2: not valid JSON"):
        data.read_records(FIXTURES / "malformed.jsonl")
    with pytest.raises(data.DataError, match=r"missing_field\.jsonl:3: record lacks result"):
        data.read_records(FIXTURES / "missing_field.jsonl")
    with pytest.raises(data.DataError, match=r"nowhere\.jsonl: no such file .*huggingface\.co/datasets/MU-NLPC/Calc-X"):
        data.read_records(tmp_path / "nowhere.jsonl")
    with pytest.raises(data.DataError, match=r"no train\*\.jsonl/train\*\.parquet file"):
        data.load(tmp_path)
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    pq.write_table(
        pa.Table.from_pylist([{"id": "a", "question": "q", "result": "1"}, {"id": "b", "result": "2"}]),
        tmp_path / "x.parquet",
    )
    with pytest.raises(data.DataError, match=r"x\.parquet: row 1: record lacks question"):
        data.read_records(tmp_path / "x.parquet")


def test_bundled_set_is_calc_x_and_its_chains_compute(tmp_path: Path) -> None:
    folder = data.write_bundled(tmp_path / "bundled")
    for name in ("train.jsonl", "test_small.jsonl", "test_large.jsonl"):
        records = [json.loads(line) for line in (folder / name).read_text().splitlines()]
        assert set(records[0]) == {"id", "question", "chain", "result", "source_ds"}
        for record in records:  # each step's output is what the calculator computes; the last is the result
            steps = re.findall(r'<gadget id="calculator">(.*?)</gadget>\n<output>(.*?)</output>', record["chain"])
            assert 1 <= len(steps) <= 2
            assert all(calculator.evaluate(expr) == float(out) for expr, out in steps)
            assert float(steps[-1][1]) == float(record["result"]) >= 0


# -- the calculator -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "value"),
    [("4 * 6", 24), ("(12 + 3) * 4", 60), ("7 / 2", 3.5), ("2 ** 10", 1024), ("-3 + 5", 2), ("2^3", 8), ("1.5*2", 3)],
)
def test_calculator_evaluates_arithmetic(expression: str, value: float) -> None:
    assert calculator.evaluate(expression) == value


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("__import__('os').system('ls')", "only numbers"),
        ("abs(-3)", "only numbers"),
        ("x + 1", "only numbers"),
        ("(1).real", "only numbers"),
        ("'a' * 3", "only numbers"),
        ("9 ** 9 ** 9", "exponent"),
        ("10 ** 20", "out of range"),
        ("1 / 0", "division by zero"),
        ("1 +", "not an arithmetic expression"),
        ("1" + "+1" * 150, "longer than"),
        ("+".join(["1"] * 40), "more than"),
        ("", "empty"),
    ],
)
def test_calculator_rejects_everything_else(expression: str, message: str) -> None:
    with pytest.raises(calculator.CalculatorError, match=message):
        calculator.evaluate(expression)


def test_calculator_formats_results() -> None:
    assert calculator.format_number(24.0) == "24" and calculator.format_number(1 / 3) == "0.3333333333"


def test_verl_config_parses() -> None:
    pytest.importorskip("agentbolt_verl")
    from agentbolt_verl import config as c

    cfg = c.load_config(EXAMPLE / "verl.yaml")
    assert "Qwen2.5-1.5B-Instruct" in str(cfg.verl)
