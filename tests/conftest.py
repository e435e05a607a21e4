"""Shared test fixtures: a throwaway PostgreSQL server and a local Ray cluster for the whole session."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from agentbolt.testing.postgres import ENV_URL, find_postgres_bindir, throwaway_postgres
from agentbolt.testing.requirements import require


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """URL of a PostgreSQL server: ``$AGENTBOLT_TEST_POSTGRES_URL`` or one started here.

    Where no PostgreSQL binaries exist it skips, saying what to install, or fails with ``CI=true``.
    """
    if os.environ.get(ENV_URL):
        yield os.environ[ENV_URL]
        return
    require(find_postgres_bindir() is not None, "PostgreSQL binaries", "apt-get install postgresql")
    with throwaway_postgres() as url:
        yield url


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    """One local Ray cluster for the session: 2 CPUs, 127.0.0.1, no dashboard. Starting one takes
    10-20 s on a 2-core machine, so the tests that run actors share it; each stops its own actors
    (a runner pool's ``stop``, the verl binding's ``on_train_end``), which is what they check."""
    # Under `uv run`, Ray would start its workers with `uv run` again; read when Ray is first imported.
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    ray = pytest.importorskip("ray")
    monkey = pytest.MonkeyPatch()
    monkey.setenv("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(address="local", num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1")
    try:
        yield
    finally:
        ray.shutdown()
        monkey.undo()
