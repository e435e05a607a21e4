"""Shared test fixtures: a throwaway PostgreSQL server for the whole session."""

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
