"""Plugin entry module: registers the LangChain / LangGraph adapter under ``"langchain"`` (cheap to import).

LangChain itself is imported only when the adapter is instrumented.
"""

from __future__ import annotations

from typing import Any

from agentbolt import hookimpl
from agentbolt.plugins import Register


def _make_adapter() -> Any:
    from .adapter import LangChainAdapter

    return LangChainAdapter()


@hookimpl
def agentbolt_register_adapters(register: Register) -> None:
    register("langchain", _make_adapter)
