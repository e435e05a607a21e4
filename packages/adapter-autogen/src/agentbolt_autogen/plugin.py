"""Plugin entry module: registers the AutoGen adapter under ``"autogen"`` (cheap to import).

AutoGen itself is imported only when the adapter is instrumented.
"""

from __future__ import annotations

from agentbolt import hookimpl
from agentbolt.plugins import Register, lazy_factory


@hookimpl
def agentbolt_register_adapters(register: Register) -> None:
    register("autogen", lazy_factory("agentbolt_autogen.adapter:AutogenAdapter"))
