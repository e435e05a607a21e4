"""Plugin entry module: registers the OpenLLMetry adapter under ``"openllmetry"`` (cheap to import)."""

from __future__ import annotations

from agentbolt import hookimpl
from agentbolt.plugins import Register, lazy_factory


@hookimpl
def agentbolt_register_adapters(register: Register) -> None:
    register("openllmetry", lazy_factory("agentbolt_openllmetry.adapter:OpenLLMetryAdapter"))
