"""Plugin entry module: registers the OpenInference adapter under ``"openinference"`` (cheap to import)."""

from __future__ import annotations

from agentbolt import hookimpl
from agentbolt.plugins import Register, lazy_factory


@hookimpl
def agentbolt_register_adapters(register: Register) -> None:
    register("openinference", lazy_factory("agentbolt_openinference.adapter:OpenInferenceAdapter"))
