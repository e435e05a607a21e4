"""examples/calc_agent: the AutoGen calculator agent end to end (tiny model, runner processes,
SQLite), its Calc-X loader on fixture files, and its safe calculator.

The example's modules (agent.py, data.py, ...) share names with the other examples', so the
end-to-end runs happen in subprocesses and the loader/calculator are imported under unique names.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
from collections import defaultdict
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


data = load_module("data")
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


def test_train_script_runs_two_steps_and_every_call_is_accounted_for(tmp_path: Path) -> None:
    db = tmp_path / "calc.db"
    proc = subprocess.run(
        [
            sys.executable,
            str(EXAMPLE / "train.py"),
            *("--model", "tiny", "--steps", "2", "--val", "6", "--batch-size", "2", "--no-progress"),
            *("--store", f"sqlite:///{db}", "--out", str(tmp_path / "out")),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "held-out accuracy" in proc.stdout and "calculator called in" in proc.stdout
    assert "LLMCall" not in proc.stderr  # AutoGen's per-call event log stays off the console
    result = json.loads((tmp_path / "out/result.json").read_text())
    assert result["example"] == "calc_agent" and result["steps"] == 2 and result["n_val"] == 6
    for key in (
        "metric_before",
        "metric_after",
        "metric_stderr_before",
        "tool_call_rate_before",
        "tool_call_rate_after",
    ):
        assert isinstance(result[key], float), key
    assert result["exact_token_id_share"] == 1.0 and result["calls_per_rollout"] >= 1.0
    assert (tmp_path / "out/curve.png").exists() and (tmp_path / "out/metrics.jsonl").exists()

    rollouts, spans = asyncio.run(_store_contents(f"sqlite:///{db}"))
    by_step: dict[str, list[t.Rollout]] = defaultdict(list)
    for r in rollouts:
        if r.mode is t.RolloutMode.TRAIN:
            by_step[r.group_id.split(":")[1]].append(r)
    assert sorted(by_step) == ["step1", "step2"] and all(len(rs) == 2 * 4 for rs in by_step.values())
    for step, step_rollouts in by_step.items():
        assert all(r.status is t.RolloutStatus.SUCCEEDED for r in step_rollouts), step
        step_spans = {r.rollout_id: spans[r.rollout_id] for r in step_rollouts}
        llm_calls = sum(semconv.TOKEN_SOURCE in s.attributes for ss in step_spans.values() for s in ss)
        batch = LightningRL(credit="final", advantage="grpo", allow_empty=True).process(step_rollouts, step_spans)
        report = batch.report
        # every LLM call the gateway recorded became a transition or an exclusion with a reason
        assert llm_calls == report.calls >= len(step_rollouts)
        assert report.trained_calls + sum(report.excluded.values()) == report.calls, report.summary()
        assert all(reason for reason in report.excluded)
        assert batch.transitions
        for tr in batch.transitions:
            assert tr.token_source == "exact" and tr.prompt_ids and tr.response_ids
            assert tr.agent_name == "solver"


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
    train, held_out = data.load(FIXTURES)
    assert len(train) == 3 and [r["answer"] for r in held_out] == [51.0, 9.0]
    assert len(data.load(FIXTURES, n_val=1)[1]) == 1


def test_loader_reads_the_parquet_release_layout(tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    (tmp_path / "data").mkdir()
    for split in ("train", "validation"):
        rows = [json.loads(line) for line in (FIXTURES / "train.jsonl").read_text().splitlines()]
        pq.write_table(pa.Table.from_pylist(rows), tmp_path / "data" / f"{split}-00000-of-00001-abc.parquet")
    train, held_out = data.load(tmp_path)  # no test split: validation is the held-out one
    assert [r["answer"] for r in train] == [r["answer"] for r in held_out] == [72.0, 0.375, 11.5]


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


def test_bundled_set_is_calc_x_deterministic_and_split(tmp_path: Path) -> None:
    folder = data.write_bundled(tmp_path / "bundled")
    again = data.write_bundled(tmp_path / "again")
    assert (folder / "train.jsonl").read_bytes() == (again / "train.jsonl").read_bytes()
    records = [json.loads(line) for line in (folder / "test.jsonl").read_text().splitlines()]
    assert set(records[0]) == {"id", "question", "chain", "result", "source_ds"}
    assert '<gadget id="calculator">' in records[0]["chain"] and "<result>" in records[0]["chain"]
    train, held_out = data.load(folder)
    assert len(train) >= 200 and len(held_out) >= 100
    assert not {r["question"] for r in train} & {r["question"] for r in held_out}
    for record in records:  # the chain's last calculator step gives the result
        steps = re.findall(r'<gadget id="calculator">(.*?)</gadget>', record["chain"])
        assert 1 <= len(steps) <= 2
        assert calculator.evaluate(steps[-1]) == float(record["result"]) >= 0


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
