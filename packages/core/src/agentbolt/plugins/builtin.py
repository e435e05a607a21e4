"""agentbolt's own implementations, registered through the same hooks as any plugin.

Factories import their modules lazily so loading plugins stays cheap.
"""

from __future__ import annotations

from typing import Any

from .hookspecs import Register, hookimpl


def _memory(url: str, **options: Any) -> Any:
    from ..store.memory import MemoryStore

    return MemoryStore(url, **options)


def _sql(url: str, **options: Any) -> Any:
    from ..store.sql import SqlStore

    return SqlStore(url, **options)


def _http(url: str, **options: Any) -> Any:
    from ..store.http import HttpStore

    return HttpStore(url, **options)


@hookimpl
def agentbolt_register_stores(register: Register) -> None:
    register("memory", _memory)
    register("sqlite", _sql)
    register("postgresql", _sql)
    register("http", _http)
    register("https", _http)


@hookimpl
def agentbolt_register_credit(register: Register) -> None:
    from ..lightningrl.registry import register_builtins

    register_builtins(register)
