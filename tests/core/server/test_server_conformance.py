"""The store conformance suite through the store server, with SQLite and memory behind it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agentbolt.store import Store, open_store
from agentbolt.store.http import HttpStore
from agentbolt.store.server import ServerThread
from agentbolt.testing.store_conformance import StoreConformance


class _OverHttp(StoreConformance):
    def backend_url(self, tmp_path: Path) -> str:
        raise NotImplementedError

    @pytest.fixture(autouse=True)
    def _servers(self) -> Iterator[None]:
        self.servers: list[ServerThread] = []
        yield
        for server in self.servers:
            server.stop()

    async def make_store(self, tmp_path: Path) -> Store:
        # No background sweeps: the suite sweeps when it means to, and the server's start-up time
        # would otherwise let a background sweep race the suite's explicit ones.
        backend = open_store(self.backend_url(tmp_path), sweep_interval_s=0)
        server = ServerThread(backend, close_store=True).start()
        self.servers.append(server)
        store = open_store(server.url)
        assert isinstance(store, HttpStore)
        return store


class TestHttpSqliteStore(_OverHttp):
    def backend_url(self, tmp_path: Path) -> str:
        return f"sqlite:///{tmp_path / 'store.db'}"


class TestHttpMemoryStore(_OverHttp):
    def backend_url(self, tmp_path: Path) -> str:
        return "memory://"
