"""The conformance suite against every built-in backend."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from agentbolt.store import Store, open_store
from agentbolt.testing.store_conformance import StoreConformance


class TestMemoryStore(StoreConformance):
    async def make_store(self, tmp_path: Path) -> Store:
        return open_store("memory://")


class TestSqliteStore(StoreConformance):
    async def make_store(self, tmp_path: Path) -> Store:
        return open_store(f"sqlite:///{tmp_path / 'store.db'}")


@pytest.mark.postgres
class TestPostgresStore(StoreConformance):
    @pytest.fixture(autouse=True)
    def _server(self, postgres_url: str) -> None:
        self.url = postgres_url

    async def make_store(self, tmp_path: Path) -> Store:
        # A fresh schema per test keeps tests independent on one server.
        return open_store(f"{self.url}?schema=t_{secrets.token_hex(6)}")
