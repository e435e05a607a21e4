"""Shared test fixtures: a throwaway PostgreSQL server for the whole session."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from agentbolt.testing.postgres import ENV_URL, find_postgres_bindir, throwaway_postgres


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """URL of a PostgreSQL server: ``$AGENTBOLT_TEST_POSTGRES_URL`` or one started here.

    Skips (with the reason) only where no PostgreSQL binaries exist.
    """
    if os.environ.get(ENV_URL):
        yield os.environ[ENV_URL]
        return
    if find_postgres_bindir() is None:
        pytest.skip("PostgreSQL binaries not found (apt-get install postgresql); PostgreSQL tests skipped")
    with throwaway_postgres() as url:
        yield url
