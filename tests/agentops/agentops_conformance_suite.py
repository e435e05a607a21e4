"""The adapter conformance suite for agentbolt-agentops, on agents instrumented with AgentOps.
Run by ``test_agentops_adapter.py`` in a fresh interpreter: ``agentops.init()`` patches LLM
clients and agent frameworks for the whole process, which must not leak into other tests."""

from __future__ import annotations

from typing import Any

import ao_agents as ao

from agentbolt.testing.adapter_conformance import AdapterConformance
from agentbolt.testing.fake_llm import FakeLLM
from agentbolt_agentops import AgentOpsAdapter

EXPORTER = ao.init_agentops()


class TestAgentOpsAdapter(AdapterConformance):
    adapter_name = "agentops"
    agent_names = {"solver"}
    llm_calls_per_rollout = 2

    def make_adapter(self) -> AgentOpsAdapter:
        return AgentOpsAdapter()

    def make_agent(self) -> Any:
        return ao.calc_agent

    def tasks(self) -> list[dict[str, Any]]:
        return ao.calc_tasks(4)

    def make_backend(self) -> FakeLLM:
        return ao.calc_backend()


class TestAgentOpsTeamConformance(TestAgentOpsAdapter):
    agent_names = {"solver", "checker"}
    llm_calls_per_rollout = 3

    def make_agent(self) -> Any:
        return ao.calc_team

    test_registered_as_a_plugin = None  # type: ignore[assignment]
    test_supported_versions_are_checked = None  # type: ignore[assignment]
    test_instrument_and_uninstrument_are_idempotent = None  # type: ignore[assignment]
