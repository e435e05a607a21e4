"""torch-grpo and torch-sft against the algorithm conformance suite (tiny model)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentbolt.algorithm import Algorithm
from agentbolt.testing.algorithm_conformance import AlgorithmConformance
from agentbolt_torch.training.algorithm import TorchGRPO
from agentbolt_torch.training.sft import TorchSFT

SMALL: dict[str, Any] = {
    "batch_size": 4,
    "group_size": 2,
    "sampling": {"max_tokens": 8},
    "evaluation": {"every": None},
    "generation": {"engine": {"batch_window_s": 0.01}},
    "update": {"lr": 1e-3},
}


class TestTorchGRPOConformance(AlgorithmConformance):
    supports_resume = True

    def make_algorithm(self, tmp_path: Path, *, steps: int, resume_from: str | None = None) -> Algorithm:
        return TorchGRPO(
            "tiny",
            steps=steps,
            output={"out_dir": tmp_path / "out", "checkpoint_every": steps, "resume": resume_from, "plot": False},
            **SMALL,
        )

    def checkpoint_of(self, result: Any) -> str:
        return result.checkpoint


class TestTorchSFTConformance(TestTorchGRPOConformance):
    def make_algorithm(self, tmp_path: Path, *, steps: int, resume_from: str | None = None) -> Algorithm:
        return TorchSFT(
            "tiny",
            steps=steps,
            threshold=0.0,  # every successful rollout (parity rewards are 0 or 1): never "nothing to train on" by chance
            output={"out_dir": tmp_path / "out", "checkpoint_every": steps, "resume": resume_from, "plot": False},
            **SMALL,
        )
