"""APO passes agentbolt's algorithm conformance suite (fake policy, scripted optimizer)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import apo_agents
import pytest

from agentbolt.algorithm import Algorithm
from agentbolt.options import GatewayOptions, RunnerOptions
from agentbolt.store.memory import MemoryStore
from agentbolt.testing.algorithm_conformance import AlgorithmConformance
from agentbolt.testing.fake_llm import FakeLLMServer
from agentbolt.trainer import Trainer
from agentbolt_apo import APO
from agentbolt_apo.testing import ScriptedOptimizer


class TestAPOConformance(AlgorithmConformance):
    agent: ClassVar[Any] = staticmethod(apo_agents.conformance_agent)

    @pytest.fixture(autouse=True)
    def servers(self) -> Iterator[None]:
        optimizer = ScriptedOptimizer(edit=lambda req: f"<prompt>{req.prompt} Be brief.</prompt>")
        with FakeLLMServer(apo_agents.policy()) as policy, FakeLLMServer(optimizer.fake_llm()) as opt:
            self.policy_url, self.optimizer_url = policy.base_url, opt.base_url
            yield

    def make_algorithm(self, tmp_path: Path, *, steps: int, resume_from: str | None = None) -> Algorithm:
        return APO(
            "Answer the question.",
            optimizer_base_url=self.optimizer_url,
            optimizer_model="fake-model",
            optimizer_api_key_env=None,
            rounds=steps,
            beam_width=1,
            branch_factor=1,
            train_batch_size=2,
            failure_threshold=2.0,  # parity rewards are 0 or 1: every task is shown to the optimizer
        )

    def trainer(self, algorithm: Algorithm, store: MemoryStore) -> Trainer:
        return Trainer(
            self.agent,
            algorithm,
            store=store,
            gateway=GatewayOptions(upstreams=self.policy_url),
            runners=RunnerOptions(n=0, concurrency=8, max_attempts=1),
            progress=False,
        )
