"""Plugin entry module: registers the OpenAI Agents SDK adapter under ``"openai-agents"`` (cheap to import).

The SDK (``agents``) itself is imported only when the adapter is instrumented.
"""

from __future__ import annotations

from agentbolt import hookimpl
from agentbolt.plugins import Register, lazy_factory


@hookimpl
def agentbolt_register_adapters(register: Register) -> None:
    register("openai-agents", lazy_factory("agentbolt_openai_agents.adapter:OpenAIAgentsAdapter"))
