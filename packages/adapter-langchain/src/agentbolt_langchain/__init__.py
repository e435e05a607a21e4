"""agentbolt adapter for LangChain and LangGraph.

Runners instrument it automatically when the package is installed; to use it by hand::

    from agentbolt_langchain import LangChainAdapter

    adapter = LangChainAdapter()
    adapter.instrument()      # graph.invoke(...) inside a rollout is now recorded, no callbacks= needed
"""

from __future__ import annotations

from agentbolt.plugins import distribution_version

from .adapter import LangChainAdapter

__version__ = distribution_version("agentbolt-langchain")

__all__ = ["LangChainAdapter", "__version__"]
