"""An agentbolt agent exported as a verifiers environment loads and scores in verifiers' own
evaluation entry point (``vf-eval``), its model calls on the fake LLM through verifiers'
interception."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import verifiers.v1 as vf

from agentbolt.errors import UserError
from agentbolt.testing.fake_llm import FakeLLM, FakeLLMServer, FakeRequest, Rule
from agentbolt_verifiers import export_environment


def calc_reply(request: FakeRequest) -> str:
    a, b = map(int, re.search(r"What is (\d+) \+ (\d+)", request.text).groups())
    return str(a + b) if a != 5 else "12"  # 5 + 8 answered wrong


@pytest.mark.timeout(900)  # vf-eval in a process of its own; slow on a busy 2-core machine
def test_exported_agent_scores_in_vf_eval(tmp_path: Path) -> None:
    fake = FakeLLM(rules=[Rule(reply=calc_reply)])
    with FakeLLMServer(fake) as server:
        env = {**os.environ, "NO_KEY": "k"}
        proc = subprocess.run(
            [
                str(Path(sys.executable).with_name("vf-eval")),
                "exported-calc-env",
                "-m",
                "fake-model",
                "--client.base-url",
                server.base_url,
                "--client.api-key-var",
                "NO_KEY",
                "--no-push",
                "--no-rich",
                "-o",
                str(tmp_path),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
        assert len(fake.requests) == 3  # the agent's calls reached the model through verifiers' interception
    (traces_file,) = tmp_path.rglob("traces.jsonl")
    episodes = [json.loads(line) for line in traces_file.read_text().splitlines() if line.strip()]
    traces = [tr for ep in episodes for tr in ep.get("traces", [ep])]
    scores = {tr["task"]["data"]["id"]: tr["rewards"]["agent_reward"]["score"] for tr in traces}
    assert scores == {"sum-2-3": 1.0, "sum-5-8": 0.0, "sum-13-21": 1.0}
    assert all(len(tr["calls"]) == 1 and tr["ok"] for tr in traces)  # verifiers recorded each call


def test_exported_classes_load_through_verifiers_loaders() -> None:
    config = vf.resolve_env_config({"taskset": {"id": "exported-calc-env"}})
    env = vf.load_environment(config)
    assert type(env).__name__ == "CalcEnv"
    assert [task.data.input for task in env.taskset] == [
        {"task_id": "sum-2-3", "a": 2, "b": 3},
        {"task_id": "sum-5-8", "a": 5, "b": 8},
        {"task_id": "sum-13-21", "a": 13, "b": 21},
    ]
    assert config.agent.runtime.type == "subprocess"
    assert config.agent_harnesses()["agent"].id == "exported-calc-env"


def test_export_needs_tasks_and_an_agent() -> None:
    with pytest.raises(UserError, match="at least one task"):
        export_environment(lambda task, resources: 1.0, [])
    with pytest.raises(UserError, match="an agent must be"):
        export_environment(42, [{"q": 1}])
