"""examples/traces_agent end to end on the tiny model (CI's budget), and its published record.

The deployed agent runs in its own process against the policy server (not the gateway), with
OpenInference and the real OTLP/HTTP exporter; its traces are ingested, scored, exported and
trained on. Counts that must agree: questions answered = traces exported = rollouts ingested =
rollouts scored; the SFT data is exactly the traces that reached the threshold, one call each,
in the chat JSONL and the ATIF file alike.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from agentbolt.runs.atif_export import read_atif, trajectory_calls, trajectory_reward

pytest.importorskip("agentbolt_torch")
pytest.importorskip("openinference.instrumentation.openai")

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "traces_agent"
RECORD = REPO / "docs" / "runs" / "traces_agent" / "smollm2.json"


@pytest.mark.timeout(900)  # two tiny-model servers, an agent process and an SFT run; slow on a busy 2-core machine
def test_tiny_run_collects_scores_exports_and_trains(tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable,
            str(EXAMPLE / "improve.py"),
            "--model",
            "tiny",
            "--traces",
            "6",
            "--val",
            "4",
            "--steps",
            "2",
            "--batch-size",
            "3",
            "--threshold",
            "0",  # the random model is never right: imitate every scored trace
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    record = json.loads((out / "result.json").read_text())
    traces = record["traces"]
    assert traces["questions"] == traces["exported"] == traces["rollouts"] == traces["scored"] == 6
    assert traces["llm_calls"] == 6  # one call per question, every one seen by the ingestion
    assert traces["kept"] == traces["demonstration_calls"] == traces["chat_calls"] == traces["atif_trajectories"] == 6
    assert record["sft"]["steps"] == 2 and record["heldout"]["n"] == 4
    assert 0.0 <= record["heldout"]["before"] <= 1.0 and 0.0 <= record["heldout"]["after"] <= 1.0
    assert set(record["trivial"]) == {"constant", "format_only", "most_frequent", "first_operand"}

    trajectories = read_atif(out / "best.atif.jsonl")  # valid ATIF v1.8, by the atif package's models
    chats = [json.loads(line) for line in (out / "best.chat.jsonl").read_text().splitlines()]
    assert len(trajectories) == len(chats) == 6
    by_rollout = {c["rollout_id"]: c for c in chats}
    for trajectory in trajectories:
        (call,) = trajectory_calls(trajectory)
        chat = by_rollout[trajectory.session_id or ""]
        assert call.messages == chat["messages"][:-1]  # the same request, read from ATIF and from chat JSONL
        assert (call.reply.get("content") or "") == (chat["messages"][-1].get("content") or "")
        assert trajectory_reward(trajectory) == chat["reward"] is not None
        assert call.logprobs is None  # a traced call: the deployment's server reported none


def test_heldout_questions_are_never_production_questions() -> None:
    """The held-out accuracy measures problems no trace (so no SFT demonstration) asked: every
    held-out problem against many more production questions than any run asks."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("traces_agent_improve", EXAMPLE / "improve.py")
    assert spec is not None and spec.loader is not None
    improve = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(improve)
    from math_tasks import N_HELDOUT_PROBLEMS  # on the path improve.py set: the quickstart's tasks

    production = {q["question"] for q in improve.production_questions(4000)}
    heldout = {q["question"] for q in improve.heldout_questions(N_HELDOUT_PROBLEMS)}
    assert len(heldout) == N_HELDOUT_PROBLEMS and len(production) > 900
    assert not production & heldout
    score = improve.make_scorer(improve.production_questions(64))
    for question in sorted(heldout)[:8]:  # the scoring function knows no held-out answer
        messages = [{"role": "user", "content": question}, {"role": "assistant", "content": "<answer>0</answer>"}]
        assert score(SimpleNamespace(trajectory=SimpleNamespace(messages=messages))) is None


def test_the_published_record_agrees_with_itself() -> None:
    record = json.loads(RECORD.read_text())
    assert record["example"] == "traces_agent" and record["model"] == "smollm2"
    assert "python examples/traces_agent/improve.py" in record["command"]
    assert len(record["commit"].removesuffix("+dirty")) == 40
    traces = record["traces"]
    assert traces["questions"] == traces["exported"] == traces["rollouts"] == traces["scored"]
    assert traces["kept"] == traces["right"] == traces["atif_trajectories"]  # threshold 1.0: the right answers
    assert record["sft"]["threshold"] == 1.0
    assert math.isclose(traces["accuracy"], traces["right"] / traces["rollouts"])
    heldout = record["heldout"]
    for when in ("before", "after"):
        p = heldout[when]
        assert 0.0 <= p <= 1.0 and math.isclose(heldout[f"{when}_se"], math.sqrt(p * (1 - p) / heldout["n"]))
        assert round(p * heldout["n"]) == pytest.approx(p * heldout["n"])  # a count of right answers
    assert math.isclose(heldout["gain"], heldout["after"] - heldout["before"])
