"""Plugin entry module: registers the OpenAI Agents SDK adapter under ``"openai-agents"`` (cheap to import).

The SDK (``agents``) itself is imported only when the adapter is instrumented.
"""

from __future__ import annotations

from typing import Any

from agentbolt import hookimpl
from agentbolt.plugins import Register


def _make_adapter() -> Any:
    from .adapter import OpenAIAgentsAdapter

    return OpenAIAgentsAdapter()


@hookimpl
def agentbolt_register_adapters(register: Register) -> None:
    register("openai-agents", _make_adapter)
