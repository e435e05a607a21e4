"""Plugin entry module: registers verifiers environments as an environment kind, ``"verifiers"``
(cheap to import: verifiers is imported only when an environment is resolved)."""

from __future__ import annotations

import sys
from typing import Any

from agentbolt import hookimpl
from agentbolt.plugins import Register


class VerifiersEnvironments:
    """Resolves a ``verifiers.v1.Env`` object, or ``"verifiers://NAME"`` (an installed environment
    package; ``"verifiers://NAME?agent.harness.id=null&taskset.num_tasks=50"`` sets config fields
    as ``vf-eval``'s ``--env.*`` flags do), to the :class:`~agentbolt_verifiers.environment.VerifiersAgent` that plays it."""

    def accepts(self, obj: Any) -> bool:
        module = sys.modules.get("verifiers.v1.env")  # not imported: obj cannot be one of its Envs
        return module is not None and isinstance(obj, module.Env)

    def agent(self, env: Any) -> Any:
        from .environment import VerifiersAgent, parse_reference

        if isinstance(env, str):
            name, config = parse_reference(env)
            return VerifiersAgent(name, **config)
        return VerifiersAgent(env)


@hookimpl
def agentbolt_register_environments(register: Register) -> None:
    register("verifiers", VerifiersEnvironments())
