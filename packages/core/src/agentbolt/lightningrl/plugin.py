"""agentbolt's built-in credit assigners and advantage estimators, registered through
``agentbolt_register_credit`` like any plugin's (the plugin manager loads this module by name, see
:data:`agentbolt.plugins.registry.BUILTIN_PLUGINS`)."""

from __future__ import annotations

from ..plugins.hookspecs import Register, hookimpl
from .registry import register_builtins


@hookimpl
def agentbolt_register_credit(register: Register) -> None:
    register_builtins(register)
