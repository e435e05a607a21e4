"""Plugin entry module: registers the OpenLLMetry adapter under ``"openllmetry"`` (cheap to import)."""

from __future__ import annotations

from typing import Any

from agentbolt import hookimpl
from agentbolt.plugins import Register


def _make_adapter() -> Any:
    from .adapter import OpenLLMetryAdapter

    return OpenLLMetryAdapter()


@hookimpl
def agentbolt_register_adapters(register: Register) -> None:
    register("openllmetry", _make_adapter)
