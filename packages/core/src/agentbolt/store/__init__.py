"""The store: rollouts, attempts, spans and resources behind one async protocol.

Open a backend by URL::

    from agentbolt.store import open_store

    store = open_store("sqlite:///runs.db")      # the embedded default
    store = open_store("memory://")              # in-process, for tests
    store = open_store("postgresql://user@host:5432/db")   # several machines

Backends are plugins registered by URL scheme (``agentbolt_register_stores``); the built-in
ones register through the same hook. Besides rollouts, attempts, spans and resources, a store
keeps the records of training and evaluation runs (:mod:`~agentbolt.store.run_records`: ``Run``,
``RunSpec``, metrics, ``RolloutSearch``). The store server is :mod:`agentbolt.store.server`.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from ..plugins.registry import default_plugins
from .base import AttemptReport, Store
from .run_records import RolloutSearch, RolloutSearchPage, Run, RunMetrics, RunSpec, RunStatus, StoreHealth
from .urls import check_store_url

__all__ = [
    "DEFAULT_STORE_URL",
    "AttemptReport",
    "RolloutSearch",
    "RolloutSearchPage",
    "Run",
    "RunMetrics",
    "RunSpec",
    "RunStatus",
    "Store",
    "StoreHealth",
    "open_store",
]

DEFAULT_STORE_URL = "sqlite:///agentbolt.db"
"""Used when no store URL is given: a SQLite file in the working directory."""


def open_store(url: str = DEFAULT_STORE_URL, *, plugins: Any = None, **options: Any) -> Store:
    """Open the store at ``url`` with the backend registered for its scheme.

    Keyword options go to the backend (e.g. ``sweep_interval_s``). Raises
    :class:`~agentbolt.errors.UserError` naming the registered schemes when none matches.
    """

    check_store_url(url)  # before anything is created: nothing is left behind by a bad URL
    assert isinstance(url, str)
    scheme = urlsplit(url).scheme.split("+", 1)[0].lower()
    scheme = {"postgres": "postgresql"}.get(scheme, scheme)
    if plugins is None:
        plugins = default_plugins()
    factory = plugins.stores.get(scheme)
    store = factory(url, **options)
    return store
