"""The adapter conformance suite, run with a real LangGraph agent (async nodes, ``ainvoke``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

pytest.importorskip("langgraph")

from lc_agents import async_sql_agent, sql_backend

from agentbolt.testing.adapter_conformance import AdapterConformance
from agentbolt.testing.fake_llm import FakeLLM
from agentbolt_langchain import LangChainAdapter


class TestLangChainAdapterConformance(AdapterConformance):
    adapter_name = "langchain"
    agent_names = {"write", "check", "rewrite"}

    def make_adapter(self) -> LangChainAdapter:
        return LangChainAdapter()

    def make_agent(self) -> Callable[..., Any]:
        return async_sql_agent

    def tasks(self) -> Sequence[Any]:
        # every third question is hard: write -> check -> rewrite -> check
        return [{"question": f"users over 30, variant {i}" + (" (hard)" if i % 3 == 0 else "")} for i in range(6)]

    def make_backend(self) -> FakeLLM:
        return sql_backend()
