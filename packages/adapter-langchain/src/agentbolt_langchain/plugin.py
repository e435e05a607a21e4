"""agentbolt plugin entry point: registers the ``langchain`` adapter.

Imports nothing of LangChain: the factory builds the adapter, and the adapter imports
langchain-core only when it is instrumented.
"""

from __future__ import annotations

from typing import Any

from agentbolt import hookimpl
from agentbolt.hookspecs import Register


def _langchain_adapter() -> Any:
    from .adapter import LangChainAdapter

    return LangChainAdapter()


@hookimpl
def agentbolt_register_adapters(register: Register) -> None:
    register("langchain", _langchain_adapter)
