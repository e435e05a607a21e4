"""Plugin entry module: registers the LangChain / LangGraph adapter under ``"langchain"`` (cheap to import).

LangChain itself is imported only when the adapter is instrumented.
"""

from __future__ import annotations

from agentbolt import hookimpl
from agentbolt.plugins import Register, lazy_factory


@hookimpl
def agentbolt_register_adapters(register: Register) -> None:
    register("langchain", lazy_factory("agentbolt_langchain.adapter:LangChainAdapter"))
