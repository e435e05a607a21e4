"""The example plugin's tests: agentbolt's algorithm conformance suite, plus what REINFORCE must
change (the weights, the policy version, the baseline), on agentbolt-torch's tiny random model.

Run from this folder after installing the package: ``pytest tests``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from agentbolt_reinforce import Reinforce, ReinforceResult

from agentbolt.algorithm import Algorithm
from agentbolt.options import RunnerOptions
from agentbolt.plugins import default_plugins
from agentbolt.store.memory import MemoryStore
from agentbolt.testing.algorithm_conformance import AlgorithmConformance, conformance_tasks, parity_agent
from agentbolt.trainer import Trainer

SMALL = {"batch_size": 4, "max_tokens": 8, "lr": 1e-2}


class TestReinforceConformance(AlgorithmConformance):
    """The contract every agentbolt algorithm keeps (REINFORCE does not resume: no checkpoints)."""

    def make_algorithm(self, tmp_path: Path, *, steps: int, resume_from: str | None = None) -> Algorithm:
        return Reinforce("tiny", steps=steps, **SMALL)


async def test_reinforce_changes_the_weights_and_moves_the_baseline() -> None:
    algorithm = Reinforce("tiny", steps=3, **SMALL)
    trainer = Trainer(
        parity_agent, algorithm, store=MemoryStore("memory://"), runners=RunnerOptions(n=0), progress=False
    )
    result = await trainer.afit(conformance_tasks(8), conformance_tasks(2))

    assert isinstance(result, ReinforceResult)
    assert result.steps == 3 and result.policy_version == 3  # one update, one version per step
    assert result.val_reward_before is not None and result.val_reward_after is not None
    rewards = [h["train/reward"] for h in result.history]
    assert result.history[0]["train/baseline"] == rewards[0]  # the first batch sets the baseline
    expected = rewards[0]
    for r in rewards:
        expected = 0.9 * expected + 0.1 * r
    assert result.baseline == pytest.approx(expected)

    from agentbolt_torch import Policy

    initial = Policy.load("tiny", seed=0)  # the same random initialisation as the run's
    changed = [
        name
        for (name, before), (_, after) in zip(
            initial.model.named_parameters(), algorithm.policy.model.named_parameters(), strict=True
        )
        if not torch.equal(before, after)
    ]
    assert changed, "three REINFORCE updates left every weight as it was"


def test_registered_by_name_through_the_entry_point() -> None:
    """Installed, the package's ``agentbolt.plugins`` entry point registers ``reinforce``."""
    entry = default_plugins().algorithms.entry("reinforce")
    assert entry.distribution == "agentbolt-reinforce 0.1.0"  # name and version
    assert isinstance(entry.value(model="tiny", steps=1), Reinforce)


def test_bad_settings_say_what_is_wrong() -> None:
    with pytest.raises(Exception, match="baseline_decay"):
        Reinforce("tiny", baseline_decay=1.0)
