"""Plugin entry module: registers the OpenInference adapter under ``"openinference"`` (cheap to import)."""

from __future__ import annotations

from typing import Any

from agentbolt import hookimpl
from agentbolt.plugins import Register


def _make_adapter() -> Any:
    from .adapter import OpenInferenceAdapter

    return OpenInferenceAdapter()


@hookimpl
def agentbolt_register_adapters(register: Register) -> None:
    register("openinference", _make_adapter)
