"""Bad store URLs and foreign databases: one clear line, exit 2, nothing created or changed;
a signal during runner start-up leaves no process behind."""

from __future__ import annotations

import hashlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from agentbolt.errors import UserError
from agentbolt.store import open_store

CORE_TESTS = str(Path(__file__).resolve().parents[1])


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentbolt.cli", *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _foreign_db(path: Path) -> Path:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    conn.execute("INSERT INTO users (name) VALUES ('ada')")
    conn.commit()
    conn.close()
    return path


def _bad_urls(tmp: Path) -> dict[str, str]:
    (tmp / "notes.txt").write_text("my notes\n")
    _foreign_db(tmp / "other.db")
    return {
        "sqlite:////etc/passwd": "system directory",
        f"sqlite:///{tmp}/missing/dir/runs.db": "does not exist",
        f"sqlite:///{tmp}": "is a directory",
        f"sqlite:///{tmp}/notes.txt": "not a SQLite database",
        f"sqlite:///{tmp}/other.db": "another application's SQLite database",
        "postgresql://db.example:port/x": "does not parse",
        "http://:4747": "must look like",
        "just-a-name": "must look like",
        "redis://localhost": "unknown store backend",
    }


def _snapshot(tmp: Path) -> dict[str, str]:
    return {str(p): _digest(p) for p in sorted(tmp.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("command", [["store", "serve", "--port", "0"], ["gateway", "serve", "--port", "0"]])
def test_bad_store_urls_give_one_line_and_exit_2(tmp_path: Path, command: list[str]) -> None:
    urls = _bad_urls(tmp_path)
    before = _snapshot(tmp_path)
    passwd = _digest(Path("/etc/passwd"))
    for url, message in urls.items():
        result = _cli(*command, "--store", url)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.returncode == 2, (url, result.stderr)
        assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], (url, result.stderr)
        assert "Traceback" not in result.stderr + result.stdout
    assert _snapshot(tmp_path) == before  # nothing created or changed (no lock, WAL or journal file)
    assert _digest(Path("/etc/passwd")) == passwd and not Path("/etc/passwd-agentbolt-lock").exists()


def test_runner_command_refuses_a_foreign_database(tmp_path: Path) -> None:
    db = _foreign_db(tmp_path / "other.db")
    before = _snapshot(tmp_path)
    result = _cli("runner", "reliability.hang_agents:quick", "--store", f"sqlite:///{db}")
    assert result.returncode == 2 and "another application's SQLite database" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert _snapshot(tmp_path) == before


def test_the_python_api_refuses_a_foreign_database_untouched(tmp_path: Path) -> None:
    db = _foreign_db(tmp_path / "other.db")
    before = _snapshot(tmp_path)
    with pytest.raises(UserError, match="another application's SQLite database"):
        open_store(f"sqlite:///{db}")
    assert _snapshot(tmp_path) == before


async def test_agentbolt_databases_and_empty_files_are_accepted(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    await open_store(url).close()
    await open_store(url).close()  # its own database: accepted again
    (tmp_path / "empty.db").touch()
    await open_store(f"sqlite:///{tmp_path}/empty.db").close()


def _children(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_signal_during_runner_start_up_leaves_no_process(tmp_path: Path, sig: signal.Signals) -> None:
    env = {**os.environ, "PYTHONPATH": CORE_TESTS + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "agentbolt.cli", "runner", "reliability.hang_agents:quick"]
    cmd += ["--store", f"sqlite:///{tmp_path}/runs.db", "--processes", "2"]
    parent = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    runners: list[psutil.Process] = []
    while len(runners) < 2 and time.monotonic() < deadline:  # the runner processes are starting
        runners = [c for c in _children(parent.pid) if "spawn_main" in " ".join(c.cmdline())]
        time.sleep(0.02)
    assert len(runners) == 2, "the runner processes did not start"
    children = _children(parent.pid)  # the runners and multiprocessing's resource tracker
    parent.send_signal(sig)
    parent.communicate(timeout=30)
    _gone, alive = psutil.wait_procs(children, timeout=15)
    assert not alive, f"runner processes left behind: {alive}"
    if sig == signal.SIGTERM:
        assert parent.returncode in (0, 130, 2), parent.returncode
