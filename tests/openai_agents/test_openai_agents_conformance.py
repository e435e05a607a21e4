"""The adapter conformance suite, with a real Agents SDK agent behind the gateway."""

from __future__ import annotations

from openai_agents_rag import TASKS, make_backend, rag_agent

from agentbolt.testing.adapter_conformance import AdapterConformance
from agentbolt_openai_agents import OpenAIAgentsAdapter


class TestOpenAIAgentsConformance(AdapterConformance):
    adapter_name = "openai-agents"
    agent_names = {"retriever", "answerer"}
    llm_calls_per_rollout = 3

    def make_adapter(self):
        return OpenAIAgentsAdapter()

    def make_agent(self):
        return rag_agent

    def tasks(self):
        return TASKS

    def make_backend(self):
        return make_backend()
