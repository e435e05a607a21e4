"""Fixtures for the store server tests: servers on 127.0.0.1 (random ports) in threads."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from agentbolt.store import Store, open_store
from agentbolt.store.server import ServerThread


@pytest.fixture
def serve() -> Iterator[Callable[..., ServerThread]]:
    """``serve(store, **options)`` starts a server for ``store`` (which it closes at the end)."""
    running: list[ServerThread] = []

    def start(store: Store | None = None, **options: Any) -> ServerThread:
        server = ServerThread(store or open_store("memory://"), close_store=True, **options).start()
        running.append(server)
        return server

    yield start
    for server in running:
        server.stop()


@pytest.fixture(scope="session")
def http() -> Iterator[httpx.Client]:
    """A plain HTTP client for requests the store client would never send."""
    with httpx.Client(timeout=30) as client:
        yield client
