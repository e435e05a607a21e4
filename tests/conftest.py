"""Shared test fixtures (a throwaway PostgreSQL server for the whole session) and how the suite
runs on several processes.

``./dev test`` runs the suite with pytest-xdist (``-n N --dist loadgroup``): each worker process
starts its own session fixtures (its own PostgreSQL server on a free port and temporary data
directory, its own fake LLM, its own docs store), and tests that must not overlap share a group,
which one worker runs one after another. :func:`pytest_collection_modifyitems` below assigns every
group, in one place:

- each test file is one group: a file's module-scoped fixtures (a built venv, a quickstart store,
  a Ray cluster, a browser, a tiny model) start once, on one worker, as in a serial run;
- except the docs code blocks (``tests/docs/test_code_blocks.py::test_code_block``, most of the
  suite's time): they spread over the workers one block at a time, but the blocks that listen on
  a fixed port (``agentbolt serve`` on 4900, ``store serve`` on 4747, ``ingest`` on 4317/4318, the
  dashboard on 4780, an OpenEnv server on 18012: see :data:`FIXED_PORT`) share the group
  ``fixed-ports``. Every other test listens on port 0 or a free port it picks;
- the Ray tests (``tests/core/test_ray_runners.py``, ``tests/verl/test_ray_runners_in_verl.py``)
  share the group ``ray``: one local Ray cluster at a time on this machine.

Serial runs (``-n 0``, or plain ``pytest``) ignore the groups.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator

import pytest

from agentbolt.testing.postgres import ENV_URL, find_postgres_bindir, throwaway_postgres
from agentbolt.testing.requirements import require

RAY_FILES = ("tests/core/test_ray_runners.py", "tests/verl/test_ray_runners_in_verl.py")
"""Test files that start a local Ray cluster (group ``ray``)."""
FIXED_PORT = re.compile(
    r"(127\.0\.0\.1|localhost|0\.0\.0\.0):\d{2,5}"  # a loopback URL: the block serves or calls a fixed port
    r"|--(grpc-)?port[ =][1-9]|port=[1-9]"  # a server told its port
    r"|agentbolt (serve|ingest|dashboard|store serve|gateway serve)\b"  # a server on its default port
)
"""What marks a docs code block (after its ``ci(replace=...)``) as one that listens on, or
calls, a fixed port (group ``fixed-ports``)."""


def _group(item: pytest.Item) -> str:
    path = item.path.relative_to(item.config.rootpath).as_posix()
    if path in RAY_FILES:
        return "ray"
    if path == "tests/docs/test_code_blocks.py" and getattr(item, "originalname", "") == "test_code_block":
        block = item.callspec.params["block"]  # type: ignore[attr-defined]
        ci = item.get_closest_marker("ci")
        options = dict(ci.kwargs) if ci is not None else {}
        code = block.code
        for old, new in options.get("replace", {}).items():
            code = code.replace(old, new)
        if options.get("serve") or FIXED_PORT.search(code):
            return "fixed-ports"
        return ""  # one block at a time
    return path


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Give each test its xdist group (see this module's docstring), and on an xdist worker
    (``--dist loadgroup``) tell the controller: append ``@group`` to the test's node id, which is
    how xdist's ``loadgroup`` scheduler reads groups. xdist 3.8 appends it by assigning
    ``item._nodeid``, which pytest 9.2's structured node ids no longer read (pytest-xdist issue
    #1386, fix proposed in #1388), so without this every test was its own group and a file's
    module fixtures started on each worker; ``tests/test_xdist_groups.py`` checks that a file's
    tests share one worker."""
    loadgroup = bool(getattr(config.option, "loadgroup", False))  # set on xdist's workers under --dist loadgroup
    for item in items:
        group = _group(item)
        if not group:
            continue
        item.add_marker(pytest.mark.xdist_group(group))
        if loadgroup and not item.nodeid.endswith(f"@{group}"):
            _rename(item, f"{item.nodeid}@{group}")


def _rename(item: pytest.Item, nodeid: str) -> None:
    """Set ``item``'s node id (pytest 9.2 keeps it as a structured ``NodeId`` in ``_id``; earlier
    versions as a string in ``_nodeid``)."""
    if hasattr(item, "_id"):
        from _pytest.nodeid import NodeId

        item._id = NodeId.parse(nodeid)  # type: ignore[attr-defined]
    else:
        item._nodeid = nodeid


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """URL of a PostgreSQL server: ``$AGENTBOLT_TEST_POSTGRES_URL`` or one started here (one per
    xdist worker: a free port, a temporary data directory).

    Where no PostgreSQL binaries exist it skips, saying what to install, or fails with ``CI=true``.
    """
    if os.environ.get(ENV_URL):
        yield os.environ[ENV_URL]
        return
    require(find_postgres_bindir() is not None, "PostgreSQL binaries", "apt-get install postgresql")
    with throwaway_postgres() as url:
        yield url
