"""examples/smolagents_agent: a smolagents team instrumented with OpenInference, trained through
agentbolt (tiny model, runner process, SQLite); its structure — agent names, tools, exact joins —
as LightningRL sees it, selective optimization of the solver, and held-out questions that share
nothing with the training ones.

The example's modules share names with the other examples': the runs happen in subprocesses and
``agent.py`` is imported under a unique name.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "smolagents_agent"


def load_agent() -> ModuleType:
    spec = importlib.util.spec_from_file_location("smolagents_example_agent", EXAMPLE / "agent.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_held_out_questions_share_nothing_with_training() -> None:
    agent = load_agent()
    train = agent.tasks(200, held_out=False)
    val = agent.tasks(100, held_out=True)
    assert {q["question"] for q in train}.isdisjoint(q["question"] for q in val)
    assert all(q["operands"][0] % 2 == 1 for q in train) and all(q["operands"][0] % 2 == 0 for q in val)
    assert agent.tasks(5, held_out=True) == agent.tasks(5, held_out=True)  # seeded


def test_train_script_runs_two_steps_on_the_tiny_model(tmp_path: Path) -> None:
    db = tmp_path / "smol.db"
    proc = subprocess.run(
        [
            sys.executable,
            str(EXAMPLE / "train.py"),
            *("--model", "tiny", "--steps", "2", "--val", "2", "--batch-size", "2", "--group-size", "2"),
            *("--max-tokens", "24", "--train-agents", "all", "--no-progress"),
            *("--store", f"sqlite:///{db}", "--out", str(tmp_path / "out")),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "held-out accuracy" in proc.stdout and "LightningRL saw" in proc.stdout
    result = json.loads((tmp_path / "out/result.json").read_text())
    assert result["example"] == "smolagents_agent" and result["steps"] == 2
    # A random model never delegates to the solver: the manager's calls are what it trains on,
    # each named from OpenInference's spans and joined to the gateway's exact token ids. Its
    # garbage grows smolagents' memory past the tiny model's 1,024-token context: those calls fail
    # upstream and are excluded with that reason, never silently.
    assert set(result["per_agent"]) == {"manager"}
    manager = result["per_agent"]["manager"]
    assert manager["trained"] > 0
    assert manager["trained"] + result["excluded"].get("failed_call", 0) == manager["calls"]
    assert set(result["excluded"]) <= {"failed_call"}
    assert result["exact_token_id_share"] == 1.0
    assert sum(result["joins"].get(k, 0) for k in ("joined_by_response_id", "joined_by_parent")) >= manager["calls"]


SCRIPTED = textwrap.dedent(
    """
    import asyncio, json, sys
    sys.path.insert(0, {example!r})
    from agent import agent, tasks
    from scripted import scripted_backend
    from agentbolt.lightningrl import LightningRL
    from agentbolt.store.memory import MemoryStore
    from agentbolt.testing.fake_llm import FakeLLMServer
    from agentbolt.trainer import Trainer

    backend = scripted_backend()
    store = MemoryStore()
    with FakeLLMServer(backend) as server:
        Trainer(agent, store=store, runners={{"n": 0}}, progress=False).dev(tasks(3, held_out=False), llm=server.base_url, model="fake-model")

    async def main():
        rollouts = (await store.query_rollouts(limit=100)).items
        spans = await store.query_spans([r.rollout_id for r in rollouts], latest_attempt_only=True)
        everything = LightningRL(credit="final", advantage="grpo", allow_empty=True).process(rollouts, spans)
        solver = LightningRL(credit="final", advantage="grpo", agent_match="^solver$", allow_empty=True).process(rollouts, spans)
        tools = sorted({{s.attributes.get("gen_ai.tool.name") for ss in spans.values() for s in ss
                        if s.attributes.get("agentbolt.span.kind") == "tool"}})
        print("RESULT " + json.dumps({{
            "rewards": [r.final_reward for r in rollouts],
            "names": [t.agent_name for t in everything.transitions],
            "sources": sorted({{t.token_source.value for t in everything.transitions}}),
            "solver_only": [t.agent_name for t in solver.transitions],
            "excluded": solver.report.excluded,
            "tools": tools,
        }}))
    asyncio.run(main())
    """
)


def test_structure_reaches_lightningrl_and_only_the_solver_is_trained() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPTED.format(example=str(EXAMPLE))], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    result = json.loads(line.removeprefix("RESULT "))
    assert result["rewards"] == [1.0, 1.0, 1.0]
    assert result["names"] == ["manager", "solver", "solver", "manager"] * 3
    assert result["sources"] == ["exact"]
    assert result["tools"] == ["calculator", "final_answer"]
    assert result["solver_only"] == ["solver", "solver"] * 3
    assert result["excluded"] == {"agent_not_selected": 6}
