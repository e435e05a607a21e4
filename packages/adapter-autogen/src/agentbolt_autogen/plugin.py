"""Plugin entry module: registers the AutoGen adapter under ``"autogen"`` (cheap to import).

AutoGen itself is imported only when the adapter is instrumented.
"""

from __future__ import annotations

from typing import Any

from agentbolt import hookimpl
from agentbolt.plugins import Register


def _make_adapter() -> Any:
    from .adapter import AutogenAdapter

    return AutogenAdapter()


@hookimpl
def agentbolt_register_adapters(register: Register) -> None:
    register("autogen", _make_adapter)
