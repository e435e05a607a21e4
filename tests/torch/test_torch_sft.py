"""``torch-sft`` end to end on the tiny model: rollouts -> kept transitions -> NLL update."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from test_torch_grpo import parity_agent

from agentbolt import types as t
from agentbolt.errors import UserError
from agentbolt.options import RunnerOptions
from agentbolt.plugins import default_plugins
from agentbolt.trainer import Trainer
from agentbolt_torch.models import tiny_model
from agentbolt_torch.training.sft import TorchSFT, select_transitions
from agentbolt_torch.update.updater import UpdateConfig

TASKS = [{"task_id": f"q{i}", "question": f"What is {i} + {i}?"} for i in range(6)]


def _sft(tmp_path: Path, **options: Any) -> TorchSFT:
    return TorchSFT(
        "tiny",
        steps=2,
        batch_size=2,
        group_size=4,
        sampling={"max_tokens": 12},
        evaluation={"every": None},
        generation={"engine": {"batch_window_s": 0.01}},
        output={"out_dir": tmp_path / "out", "checkpoint_every": 2},
        update={"lr": 1e-2},
        **options,
    )


async def all_but_q3_agent(task: dict[str, Any], resources: t.Resources) -> float:
    """Asks the policy once; reward 1.0 for every task but ``q3`` whatever the reply (so what
    passes the threshold does not depend on what the random model samples)."""
    await parity_agent(task, resources)
    return 0.0 if task["task_id"] == "q3" else 1.0


def test_trains_on_passing_rollouts_only(tmp_path: Path) -> None:
    trainer = Trainer(
        all_but_q3_agent, _sft(tmp_path, threshold=1.0), store="memory://", runners=RunnerOptions(n=0), progress=False
    )
    result = trainer.fit(TASKS[:4], TASKS[4:])

    records = [json.loads(line) for line in Path(result.metrics_path).read_text().splitlines()]
    trained = [r for r in records if "update/loss" in r]
    # two steps of two tasks x four samples: one step holds q3 (its 4 rollouts fail the threshold)
    assert sorted(r["train/kept_rollouts"] for r in trained) == [4, 8], records
    for r in trained:
        assert r["update/n_transitions"] == r["train/kept_rollouts"]  # one call per rollout, only passing ones
        assert r["update/loss"] > 0  # NLL of sampled tokens is positive
    initial, _ = tiny_model(seed=0)
    weights = load_file(Path(result.checkpoint) / "model" / "model.safetensors")
    assert any(not torch.equal(v, weights[k]) for k, v in initial.state_dict().items() if k in weights)

    # init_from: a second run starts from the first run's weights
    again = TorchSFT(init_from=result.checkpoint, steps=0)
    assert again.model.endswith("model")


def test_nothing_above_threshold_stops_with_a_clear_message(tmp_path: Path) -> None:
    trainer = Trainer(
        parity_agent, _sft(tmp_path, threshold=2.0), store="memory://", runners=RunnerOptions(n=0), progress=False
    )
    with pytest.raises(UserError, match=r"no transition to train on .*Nothing was updated. Lower threshold"):
        trainer.fit(TASKS[:4], TASKS[4:])


def test_select_transitions_threshold_and_best_k() -> None:
    def rollout(rid: str, task: str, reward: float) -> t.Rollout:
        return t.Rollout(rollout_id=rid, task_id=task, final_reward=reward)

    rollouts = [rollout("a", "x", 1.0), rollout("b", "x", 0.5), rollout("c", "x", 0.9), rollout("d", "y", 0.2)]
    transitions = [
        t.Transition(rollout_id=r.rollout_id, index=0, prompt_ids=[1], response_ids=[2], advantage=-3.0)
        for r in rollouts
    ]
    kept = select_transitions(rollouts, transitions, threshold=0.5)
    assert [tr.rollout_id for tr in kept] == ["a", "b", "c"] and {tr.advantage for tr in kept} == {1.0}
    assert [tr.rollout_id for tr in select_transitions(rollouts, transitions, threshold=0.0, best_k=1)] == ["a", "d"]


def test_registered_and_validates(tmp_path: Path) -> None:
    algo = default_plugins().algorithms.get("torch-sft")(model="tiny", steps=1)
    assert isinstance(algo, TorchSFT) and algo.update_config["objective"] == "nll"
    with pytest.raises(UserError, match="best_k"):
        TorchSFT(best_k=0)
    with pytest.raises(UserError, match="init_from"):
        TorchSFT(init_from=tmp_path)
    with pytest.raises(UserError, match="objective"):
        UpdateConfig(objective="mse")  # type: ignore[arg-type]
