"""benchmarks/online.py keeps working: its scripted judge scores a quickstart session as the
quickstart's reward does, and a short scripted run serves, trains and counts nothing lost."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from agentbolt.rewards.trajectory import render_messages

REPO = Path(__file__).resolve().parents[3]


def _benchmark() -> ModuleType:
    spec = importlib.util.spec_from_file_location("online_benchmark", REPO / "benchmarks" / "online.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_scripted_judge_applies_the_quickstart_reward_to_the_transcript(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO / "examples" / "quickstart"))
    bench = _benchmark()
    from math_tasks import few_shot

    def transcript(question: str, *answers: str) -> str:
        messages = [*few_shot(True), {"role": "user", "content": question}]
        messages += [{"role": "assistant", "content": a} for a in answers]
        return render_messages(messages)

    # the few-shot examples hold other questions and <answer> tags: only what follows the question counts
    assert bench.quickstart_rubric(transcript("What is 17 - 9?", "17 - 9 = 8. <answer>8</answer>")) == 10.0
    assert bench.quickstart_rubric(transcript("What is 17 - 9?", "<answer>7</answer>")) == 1.0  # wrong, well-formed
    assert bench.quickstart_rubric(transcript("What is 17 - 9?", "It is eight.")) == 0.0  # no tag after the question
    assert bench.quickstart_rubric(transcript("What is 12 + 20?", "let me see", "<answer>32</answer>")) == 10.0
    assert bench.quickstart_rubric("[user] hello") == 0.0


def test_a_short_scripted_run_serves_trains_and_loses_nothing(tmp_path: Path) -> None:
    record = tmp_path / "online.json"
    run = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "online.py"), "--seconds", "4", "--users", "3",
         "--min-sessions", "4", "--max-delay", "0.5", "--train-seconds", "0.2", "--json", str(record)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    figures = json.loads(record.read_text())
    assert figures["sessions"] > 0 and figures["requests_failed"] == 0 and figures["feedback_lost"] == 0
    assert figures["feedback_acknowledged"] == figures["feedback_sent"] > 0
    assert figures["updates"] >= 1 and figures["timeline"], figures
    again = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "online.py"), "--report", str(record)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert f"requests failed {figures['requests_failed']}" in again.stdout
