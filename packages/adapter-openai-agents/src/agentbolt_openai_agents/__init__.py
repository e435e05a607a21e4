"""agentbolt adapter for the OpenAI Agents SDK (``openai-agents``).

Installed, it needs no code: agentbolt runners instrument it, and every ``Runner.run`` inside a
rollout is recorded as spans (agents, LLM calls joined to the gateway's exact token ids, tools,
handoffs). ``agents`` is imported only when the adapter is instrumented.
"""

from __future__ import annotations

import importlib.metadata

from .adapter import OpenAIAgentsAdapter
from .errors import CaptureOffError, CaptureWarning

try:
    __version__ = importlib.metadata.version("agentbolt-openai-agents")
except importlib.metadata.PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0+unknown"

__all__ = ["CaptureOffError", "CaptureWarning", "OpenAIAgentsAdapter", "__version__"]
