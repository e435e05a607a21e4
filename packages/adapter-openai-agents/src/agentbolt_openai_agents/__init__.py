"""agentbolt adapter for the OpenAI Agents SDK (``openai-agents``).

Installed, it needs no code: agentbolt runners instrument it, and every ``Runner.run`` inside a
rollout is recorded as spans (agents, LLM calls joined to the gateway's exact token ids, tools,
handoffs). ``agents`` is imported only when the adapter is instrumented.
"""

from __future__ import annotations

from agentbolt.plugins import distribution_version

from .adapter import OpenAIAgentsAdapter
from .errors import CaptureOffError, CaptureWarning

__version__ = distribution_version("agentbolt-openai-agents")

__all__ = ["CaptureOffError", "CaptureWarning", "OpenAIAgentsAdapter", "__version__"]
