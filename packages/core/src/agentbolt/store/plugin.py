"""agentbolt's built-in store backends, registered through ``agentbolt_register_stores`` like any
plugin's (the plugin manager loads this module by name, see
:data:`agentbolt.plugins.registry.BUILTIN_PLUGINS`).

Factories import their backends when called: SQLAlchemy and httpx load only for the store opened.
"""

from __future__ import annotations

from typing import Any

from ..plugins.hookspecs import Register, hookimpl


def _memory(url: str, **options: Any) -> Any:
    from .memory import MemoryStore

    return MemoryStore(url, **options)  # type: ignore[abstract]  # Store's operations are derived from its declarations at run time (store.operations)


def _sql(url: str, **options: Any) -> Any:
    from .sql import SqlStore  # SQLAlchemy

    return SqlStore(url, **options)  # type: ignore[abstract]  # Store's operations are derived from its declarations at run time (store.operations)


def _http(url: str, **options: Any) -> Any:
    from .http import HttpStore  # httpx

    return HttpStore(url, **options)  # type: ignore[abstract]  # Store's operations are derived from its declarations at run time (store.operations)


@hookimpl
def agentbolt_register_stores(register: Register) -> None:
    register("memory", _memory)
    register("sqlite", _sql)
    register("postgresql", _sql)
    register("http", _http)
    register("https", _http)
