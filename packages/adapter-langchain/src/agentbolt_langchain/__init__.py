"""agentbolt adapter for LangChain and LangGraph.

Runners instrument it automatically when the package is installed; to use it by hand::

    from agentbolt_langchain import LangChainAdapter

    adapter = LangChainAdapter()
    adapter.instrument()      # graph.invoke(...) inside a rollout is now recorded, no callbacks= needed
"""

from __future__ import annotations

import importlib.metadata

from .adapter import LangChainAdapter

try:
    __version__ = importlib.metadata.version("agentbolt-langchain")
except importlib.metadata.PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0+unknown"

__all__ = ["LangChainAdapter", "__version__"]
