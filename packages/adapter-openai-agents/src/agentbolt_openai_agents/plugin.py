"""Plugin entry module: registers the OpenAI Agents SDK adapter (imports neither ``agents`` nor the adapter)."""

from __future__ import annotations

from typing import Any

from agentbolt import hookimpl

ADAPTER_NAME = "openai-agents"


def make_adapter() -> Any:
    """The adapter factory the registry holds: ``agents`` is imported at ``instrument()``."""
    from .adapter import OpenAIAgentsAdapter

    return OpenAIAgentsAdapter()


@hookimpl
def agentbolt_register_adapters(register: Any) -> None:
    register(ADAPTER_NAME, make_adapter)
