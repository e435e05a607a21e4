"""Plugin entry module: registers the AgentOps adapter under ``"agentops"`` and the opt-in
AgentOps tracer under ``"agentops-tracer"`` (cheap to import)."""

from __future__ import annotations

from agentbolt import hookimpl
from agentbolt.plugins import Register, lazy_factory


@hookimpl
def agentbolt_register_adapters(register: Register) -> None:
    register("agentops", lazy_factory("agentbolt_agentops.adapter:AgentOpsAdapter"))
    register("agentops-tracer", lazy_factory("agentbolt_agentops.adapter:AgentOpsTracerAdapter"))
