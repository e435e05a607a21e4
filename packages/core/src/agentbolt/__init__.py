"""agentbolt: train any AI agent with reinforcement learning, with almost zero change to the agent."""

from __future__ import annotations

import importlib.metadata

from .hookspecs import hookimpl

try:
    __version__ = importlib.metadata.version("agentbolt")
except importlib.metadata.PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0+unknown"

__all__ = ["__version__", "hookimpl"]
