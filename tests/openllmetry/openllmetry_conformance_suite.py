"""The adapter conformance suite for agentbolt-openllmetry, on agents instrumented with the
Traceloop SDK. Run by ``test_openllmetry_adapter.py`` in a fresh interpreter: ``Traceloop.init``
patches the OpenAI client for the whole process, which must not leak into other tests."""

from __future__ import annotations

from typing import Any

import ol_agents as ol

from agentbolt.testing.adapter_conformance import AdapterConformance
from agentbolt.testing.fake_llm import FakeLLM
from agentbolt_openllmetry import OpenLLMetryAdapter

EXPORTER = ol.init_traceloop()


class TestOpenLLMetryAdapter(AdapterConformance):
    adapter_name = "openllmetry"
    agent_names = {"solver"}
    llm_calls_per_rollout = 2

    def make_adapter(self) -> OpenLLMetryAdapter:
        return OpenLLMetryAdapter()

    def make_agent(self) -> Any:
        return ol.calc_agent

    def tasks(self) -> list[dict[str, Any]]:
        return ol.calc_tasks(4)

    def make_backend(self) -> FakeLLM:
        return ol.calc_backend()


class TestOpenLLMetryTeamConformance(TestOpenLLMetryAdapter):
    agent_names = {"solver", "checker"}
    llm_calls_per_rollout = 3

    def make_agent(self) -> Any:
        return ol.calc_team

    test_registered_as_a_plugin = None  # type: ignore[assignment]
    test_supported_versions_are_checked = None  # type: ignore[assignment]
    test_instrument_and_uninstrument_are_idempotent = None  # type: ignore[assignment]
