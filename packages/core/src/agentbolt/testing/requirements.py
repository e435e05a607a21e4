"""What a test needs from the machine (a PostgreSQL server, a browser): outside CI a missing one
skips the test with what to install; with ``CI`` set (``CI=true``, as GitHub Actions, GitLab and
``.ci/run`` set it) it fails the test, so CI cannot pass by skipping.

    require(find_postgres_bindir() is not None, "PostgreSQL binaries", "apt-get install postgresql")
"""

from __future__ import annotations

import os

import pytest

__all__ = ["in_ci", "require"]

_FALSE = {"", "0", "false", "no", "off"}


def in_ci() -> bool:
    """Whether the tests run in CI: the ``CI`` environment variable is set to a true value."""
    return os.environ.get("CI", "").strip().lower() not in _FALSE


def require(present: bool, what: str, install: str) -> None:
    """Skip the calling test (fixture) when ``present`` is false, saying what is missing and how to
    install it; in CI, fail it instead."""
    if present:
        return
    message = f"{what} not found ({install})"
    if in_ci():
        pytest.fail(f"{message}; CI={os.environ['CI']} fails tests that would skip for it", pytrace=False)
    pytest.skip(f"{message}; tests that need it skipped (with CI=true they fail)")
