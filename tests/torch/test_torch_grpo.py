"""``torch-grpo`` end to end: Trainer -> store -> runner -> agent (OpenAI client) -> gateway ->
policy server -> spans -> LightningRL -> update, on the tiny random model."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from agentbolt.errors import UserError
from agentbolt.lightningrl import LightningRLConfig
from agentbolt.options import RunnerOptions
from agentbolt.plugins import default_plugins
from agentbolt.trainer import Trainer
from agentbolt.types import Resources
from agentbolt_torch.models import tiny_model
from agentbolt_torch.training.algorithm import TorchGRPO

REPO = Path(__file__).resolve().parents[2]


async def parity_agent(task: dict[str, Any], resources: Resources) -> float:
    """Any reply-dependent reward with variance inside a group: the parity of the reply length."""
    import openai

    assert resources.llm is not None
    client = openai.AsyncOpenAI(base_url=resources.llm.base_url, api_key="none", max_retries=0)
    reply = await client.chat.completions.create(
        model=resources.llm.model, messages=[{"role": "user", "content": task["question"]}]
    )
    return float(len(reply.choices[0].message.content or "") % 2)


def alternating_agent() -> Callable[[dict[str, Any], Resources], Awaitable[float]]:
    """Asks the policy once, then rewards its task's rollouts 0, 1, 0, 1, ... in the order they
    finish: every group of an even size has reward variance (so a gradient) whatever the random
    model samples."""
    finished: Counter[str] = Counter()

    async def agent(task: dict[str, Any], resources: Resources) -> float:
        await parity_agent(task, resources)
        finished[task["task_id"]] += 1
        return float(finished[task["task_id"]] % 2)

    return agent


def test_two_steps_through_the_whole_pipeline(tmp_path: Path) -> None:
    tasks = [{"task_id": f"q{i}", "question": f"What is {i} + {i}?"} for i in range(6)]
    algorithm = TorchGRPO(
        "tiny",
        steps=2,
        batch_size=2,
        group_size=4,
        sampling={"max_tokens": 12},
        evaluation={"every": None},
        generation={"engine": {"batch_window_s": 0.01}},
        output={"out_dir": tmp_path / "out", "checkpoint_every": 2},
        update={"lr": 1e-2},
    )
    trainer = Trainer(
        alternating_agent(),
        algorithm,
        store=f"sqlite:///{tmp_path}/runs.db",
        runners=RunnerOptions(n=0, concurrency=8),
        progress=False,
    )
    result = trainer.fit(tasks[:4], tasks[4:])

    assert result.steps == 2 and result.policy_version == 2
    assert result.accuracy_before is not None and result.accuracy_after is not None
    records = [json.loads(line) for line in Path(result.metrics_path).read_text().splitlines()]
    updates = [r for r in records if "update/loss" in r]
    assert len(updates) == 2
    for r in updates:
        assert math.isfinite(r["update/loss"]) and r["update/n_transitions"] == 8 and r["train/transitions"] == 8
        assert r["lightningrl/trained_calls"] == 8  # every call recorded with exact token ids
        assert abs(r["update/logprob_mismatch"]) < 0.05  # served logprobs are the trained policy's
    assert all(r["update/grad_norm"] > 0 for r in updates), "no gradient although every group's rewards vary"
    assert [r["step"] for r in records if "val/accuracy" in r] == [0, 2]
    assert Path(result.curve_png).read_bytes()[:4] == b"\x89PNG"

    initial, _ = tiny_model(seed=0)
    trained = load_file(Path(result.checkpoint) / "model" / "model.safetensors")
    changed = [k for k, v in initial.state_dict().items() if k in trained and not torch.equal(v, trained[k])]
    assert changed, "the update did not change the weights"


def test_registered_by_name_and_validates() -> None:
    assert isinstance(default_plugins().algorithms.get("torch-grpo")(model="tiny", steps=1), TorchGRPO)
    with pytest.raises(UserError, match="batch_size"):
        TorchGRPO("tiny", batch_size=0)


def test_trainer_hands_one_lightningrl_config_to_the_algorithm(tmp_path: Path) -> None:
    config = LightningRLConfig(agent_match="solver", loss_aggregation="token-mean")
    trainer = Trainer(
        lambda task, resources: 1.0,
        "torch-grpo",
        algorithm_config={"model": "tiny", "output": {"out_dir": str(tmp_path)}},
        lightningrl=config,
        runners=RunnerOptions(n=0),
        store="memory://",
    )
    algorithm = trainer._make_algorithm()
    assert isinstance(algorithm, TorchGRPO) and algorithm.lightningrl is config
    recorded = algorithm.run_config()["lightningrl"]  # what the dashboard rebuilds LightningRL from
    assert recorded["agent_match"] == "solver" and recorded["loss_aggregation"] == "token-mean"
    assert TorchGRPO("tiny", lightningrl={"credit": "discounted"}).lightningrl.credit == "discounted"
    with pytest.raises(UserError, match="valid fields"):
        TorchGRPO("tiny", lightningrl={"agent_matcher": "solver"})
    with pytest.raises(UserError, match="pass it to the algorithm's own constructor"):
        Trainer(
            lambda task, resources: 1.0,
            TorchGRPO("tiny"),
            lightningrl=config,
            runners=RunnerOptions(n=0),
            store="memory://",
        )


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_quickstart_script_runs_on_the_tiny_model(tmp_path: Path) -> None:
    """The README's main command, shrunk: runner processes, SQLite, checkpoint, curve, result.json."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "examples/quickstart/train.py"),
            *("--model", "tiny", "--steps", "2", "--val", "8", "--batch-size", "2", "--no-progress"),
            *("--store", f"sqlite:///{tmp_path}/q.db", "--out", str(tmp_path / "out")),
        ],
        capture_output=True,
        text=True,
        timeout=900,  # a loaded 2-core machine: minutes; pytest-timeout caps the test itself
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "held-out accuracy" in proc.stdout
    found = re.search(
        r"peak memory of the run: (\d+\.\d\d) GiB \(this process and (\d+) it started, RSS summed, sampled every "
        r"0\.25 s\); this process alone (\d+\.\d\d) GiB \((tcmalloc|jemalloc|mimalloc|glibc malloc)\)",
        proc.stdout,
    )
    assert found, proc.stdout[-2000:]
    run_gib, started, trainer_gib = float(found.group(1)), int(found.group(2)), float(found.group(3))
    assert started >= 1  # the runner process is counted
    assert run_gib > 0 and trainer_gib > 0
    result = json.loads((tmp_path / "out/result.json").read_text())  # the run record (docs/runs/ shape)
    assert result["example"] == "quickstart" and result["steps"] == 2 and result["headline"] == "arithmetic/accuracy"
    assert f"{result['extra']['peak_rss_gib_run']:.2f}" == found.group(1)  # the record says what was printed
    heldout = result["heldout"]["arithmetic"]  # the held-out set, named for what it holds
    assert heldout["n"] == 8 and set(heldout["stages"]) == {"step 0", "step 2"}
    assert heldout["stages"]["step 2"]["score"] == heldout["after"]
    assert (tmp_path / "out/curve.png").exists() and (tmp_path / "out/checkpoint-final").is_dir()


def test_the_run_and_its_metrics_are_recorded_in_the_store(tmp_path: Path) -> None:
    import asyncio

    from agentbolt.store import RolloutSearch, RunStatus, open_store

    tasks = [{"task_id": f"q{i}", "question": f"What is {i} + {i}?"} for i in range(3)]
    algorithm = TorchGRPO(
        "tiny",
        steps=1,
        batch_size=2,
        group_size=2,
        sampling={"max_tokens": 8},
        evaluation={"every": None},
        output={"out_dir": tmp_path / "out", "plot": False},
    )
    url = f"sqlite:///{tmp_path}/runs.db"
    Trainer(parity_agent, algorithm, store=url, runners=RunnerOptions(n=0), progress=False, run={"name": "parity"}).fit(
        tasks[:2], tasks[2:]
    )

    async def read() -> tuple[Any, ...]:
        store = open_store(url)
        try:
            (run,) = await store.list_runs()
            metrics = await store.get_run_metrics(run.run_id)
            page = await store.search_rollouts(RolloutSearch(run_id=run.run_id, step=1, mode="train"))
            return run, metrics, page
        finally:
            await store.close()

    run, metrics, page = asyncio.run(read())
    assert (run.name, run.algorithm, run.model, run.status) == ("parity", "torch-grpo", "tiny", RunStatus.SUCCEEDED)
    assert run.config["steps"] == 1 and run.config["group_size"] == 2 and run.ended_at is not None
    assert run.steps == 1 and "update/loss" in run.latest and "val/reward" in run.latest
    assert [m.step for m in metrics] == [0, 1, 1]  # held-out before, the training step, held-out after
    assert page.total == 4 and all(r.run_id == run.run_id and r.step == 1 for r in page.items)


def test_val_before_false_skips_the_first_held_out_pass(tmp_path: Path) -> None:
    """A stage after another (RL after SFT) need not re-measure the weights it starts from."""
    tasks = [{"task_id": f"q{i}", "question": f"What is {i} + {i}?"} for i in range(4)]
    algorithm = TorchGRPO(
        "tiny",
        steps=1,
        batch_size=2,
        group_size=2,
        sampling={"max_tokens": 8},
        evaluation={"every": None, "before": False},
        generation={"engine": {"batch_window_s": 0.01}},
        output={"out_dir": tmp_path / "out"},
    )
    result = Trainer(parity_agent, algorithm, store="memory://", runners=RunnerOptions(n=0), progress=False).fit(
        tasks[:2], tasks[2:]
    )
    assert result.accuracy_before is None and result.accuracy_after is not None
    records = [json.loads(line) for line in Path(result.metrics_path).read_text().splitlines()]
    assert [r["step"] for r in records if "val/accuracy" in r] == [1]
