"""Start a throwaway PostgreSQL server for tests and benchmarks.

PostgreSQL refuses to run as root, so when the current user is root the cluster is created and
run as the ``postgres`` system user. The server listens on 127.0.0.1 only, with trust
authentication, in a temporary directory that is removed on exit.

    with throwaway_postgres() as url:      # postgresql://postgres@127.0.0.1:PORT/postgres
        store = open_store(url)
"""

from __future__ import annotations

import contextlib
import glob
import os
import shlex
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["find_postgres_bindir", "throwaway_postgres"]

ENV_URL = "AGENTBOLT_TEST_POSTGRES_URL"
"""If set, tests use this server instead of starting one."""


def find_postgres_bindir() -> Path | None:
    """The directory holding ``initdb`` and ``pg_ctl``, or ``None`` if PostgreSQL is absent."""
    candidates = []
    if shutil.which("pg_config"):
        with contextlib.suppress(OSError, subprocess.CalledProcessError):
            candidates.append(subprocess.check_output(["pg_config", "--bindir"], text=True).strip())
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(str(Path(initdb).parent))
    for c in candidates:
        if (Path(c) / "initdb").exists() and (Path(c) / "pg_ctl").exists():
            return Path(c)
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_postgres(cmd: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return cmd
    runuser = shutil.which("runuser")
    if runuser:
        return [runuser, "-u", "postgres", "--", *cmd]
    return ["su", "postgres", "-s", "/bin/sh", "-c", shlex.join(cmd)]


@contextlib.contextmanager
def throwaway_postgres(port: int | None = None) -> Iterator[str]:
    """Run a fresh PostgreSQL cluster for the duration of the block; yields its URL.

    Raises:
        RuntimeError: no PostgreSQL binaries, or the server failed to start (with its log).
    """
    bindir = find_postgres_bindir()
    if bindir is None:
        raise RuntimeError("PostgreSQL binaries not found; install them (apt-get install postgresql)")
    root = Path(tempfile.mkdtemp(prefix="agentbolt-pg-"))
    data, log = root / "data", root / "server.log"
    port = port or _free_port()
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
        root.chmod(0o755)
    try:
        subprocess.run(
            # -N: a throwaway cluster need not be flushed to disk (its server runs with fsync=off too)
            _as_postgres(
                [str(bindir / "initdb"), "-N", "-D", str(data), "-A", "trust", "-U", "postgres", "-E", "UTF8"]
            ),
            check=True,
            capture_output=True,
            text=True,
        )
        opts = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        started = subprocess.run(
            _as_postgres([str(bindir / "pg_ctl"), "-D", str(data), "-o", opts, "-l", str(log), "-w", "start"]),
            capture_output=True,
            text=True,
        )
        if started.returncode != 0:
            detail = log.read_text() if log.exists() else started.stderr
            raise RuntimeError(f"PostgreSQL failed to start:\n{detail}")
        try:
            yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
        finally:
            subprocess.run(
                _as_postgres([str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"]),
                capture_output=True,
            )
    except subprocess.CalledProcessError as exc:
        raise RuntimeError(f"PostgreSQL set-up failed: {exc.stderr}") from exc
    finally:
        shutil.rmtree(root, ignore_errors=True)
