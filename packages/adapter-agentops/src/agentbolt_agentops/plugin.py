"""Plugin entry module: registers the AgentOps adapter under ``"agentops"`` and the opt-in
AgentOps tracer under ``"agentops-tracer"`` (cheap to import)."""

from __future__ import annotations

from typing import Any

from agentbolt import hookimpl
from agentbolt.plugins import Register


def _make_adapter() -> Any:
    from .adapter import AgentOpsAdapter

    return AgentOpsAdapter()


def _make_tracer() -> Any:
    from .adapter import AgentOpsTracerAdapter

    return AgentOpsTracerAdapter()


@hookimpl
def agentbolt_register_adapters(register: Register) -> None:
    register("agentops", _make_adapter)
    register("agentops-tracer", _make_tracer)
