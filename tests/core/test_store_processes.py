"""Several processes on one store, and crash safety of the SQLite store."""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from agentbolt import types as t
from agentbolt.store import open_store

WORKER = str(Path(__file__).with_name("store_worker.py"))


def start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, WORKER, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1
    )


def wait_ready(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == "ready", (line, proc.stderr.read() if proc.stderr else "")


async def run_consumers(url: str, n_rollouts: int, n_procs: int) -> list[str]:
    procs = [start("consume", url, f"p{i}") for i in range(n_procs)]
    for p in procs:
        wait_ready(p)
    # Enqueued after the workers block in dequeue(wait_s=...): another process's commit wakes them.
    store = open_store(url)
    for i in range(0, n_rollouts, 50):
        await store.enqueue([t.RolloutSpec(rollout_id=f"r{j}") for j in range(i, min(i + 50, n_rollouts))])
    claimed: list[str] = []
    for p in procs:
        out, err = await asyncio.to_thread(p.communicate, timeout=240)
        assert p.returncode == 0, err
        claimed += [line.split()[1] for line in out.splitlines() if line.startswith("claimed")]
    counts = await store.count_rollouts()
    spans = await store.query_spans([f"r{i}" for i in range(n_rollouts)])
    await store.close()
    assert counts[t.RolloutStatus.SUCCEEDED] == n_rollouts
    assert all(len(v) == 1 for v in spans.values())
    return claimed


async def test_sqlite_processes_never_share_a_rollout(tmp_path: Path) -> None:
    claimed = await run_consumers(f"sqlite:///{tmp_path / 'shared.db'}", n_rollouts=240, n_procs=3)
    assert sorted(claimed) == sorted(f"r{i}" for i in range(240))  # each exactly once


@pytest.mark.postgres
async def test_postgres_processes_never_share_a_rollout(postgres_url: str) -> None:
    url = f"{postgres_url}?schema=p_{secrets.token_hex(5)}"
    await open_store(url).close()  # create the schema once before the workers race to
    claimed = await run_consumers(url, n_rollouts=240, n_procs=3)
    assert sorted(claimed) == sorted(f"r{i}" for i in range(240))


@pytest.mark.postgres
async def test_postgres_store_instances_lock_rows(postgres_url: str) -> None:
    url = f"{postgres_url}?schema=l_{secrets.token_hex(5)}"
    stores = [open_store(url) for _ in range(3)]  # separate connection pools
    await stores[0].enqueue([t.RolloutSpec(rollout_id=f"r{i}") for i in range(150)])

    async def drain(store: object, w: int) -> list[str]:
        got: list[str] = []
        while claims := await store.dequeue(f"w{w}", limit=3):  # type: ignore[attr-defined]
            got += [c.rollout.rollout_id for c in claims]
            for c in claims:
                await store.finish_attempt(c.attempt.attempt_id, t.AttemptStatus.SUCCEEDED)  # type: ignore[attr-defined]
        return got

    results = await asyncio.gather(*(drain(stores[w % 3], w) for w in range(9)))
    claimed = [r for chunk in results for r in chunk]
    assert sorted(claimed) == sorted(f"r{i}" for i in range(150))
    for s in stores:
        await s.close()


async def test_sigkill_loses_no_acknowledged_write(tmp_path: Path) -> None:
    path = tmp_path / "crash.db"
    url = f"sqlite:///{path}"
    proc = start("write", url, "c")
    assert proc.stdout is not None
    acked: list[str] = []
    while sum(line.startswith("finished") for line in acked) < 25:
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.stderr else "writer died"
        acked.append(line.split("\n")[0])
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    # Lines the writer printed after its last read are acknowledged too; take them all.
    acked += [line for line in proc.stdout.read().splitlines() if line]

    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()
    store = open_store(url)
    enqueued = [line.split()[1] for line in acked if line.startswith("enqueued")]
    rollouts = {r.rollout_id: r for r in await store.get_rollouts(enqueued)}
    spans = await store.query_spans(enqueued)
    for line in acked:
        kind, rid, *rest = line.split()
        if kind == "spans":
            assert {s.span_id for s in spans[rid]} >= set(rest)
        elif kind == "finished":
            assert rollouts[rid].status is t.RolloutStatus.SUCCEEDED
            assert rollouts[rid].final_reward == float(rest[0])
    # The database keeps working after the crash.
    claimed = await store.dequeue("after-crash", limit=100)
    for c in claimed:
        await store.finish_attempt(c.attempt.attempt_id, t.AttemptStatus.SUCCEEDED)
    await store.close()


def _count_elsewhere(db: Path) -> int:
    """How many rollouts a new process sees in the file."""
    code = f"import sqlite3; print(sqlite3.connect({str(db)!r}).execute('SELECT COUNT(*) FROM rollouts').fetchone()[0])"
    return int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


_HOLDER = """
import asyncio, sys
from agentbolt.store import open_store
from agentbolt import types as t
async def main():
    store = open_store(sys.argv[1])
    await store.enqueue([t.RolloutSpec(rollout_id=sys.argv[2])])
    print("ready", flush=True)
    sys.stdin.readline()
    await store.close()
asyncio.run(main())
"""


async def test_a_store_reopened_in_the_same_process_writes_where_other_processes_read(tmp_path: Path) -> None:
    """Two stores one after the other in one process, another process beside each (a Trainer run
    after another, each with its runner process). The writer thread used to keep its connection
    when it was stopped idle; the other process, closing last, then deleted the WAL that connection
    still held, and the next store of this process wrote into the deleted file: its rollouts were
    invisible to every other process (the second run's runners never saw them)."""
    import fcntl

    db = tmp_path / "reopened.db"
    url = f"sqlite:///{db}"
    for i in range(3):
        holder = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, url, f"other{i}"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert holder.stdin is not None and holder.stdout is not None
        assert holder.stdout.readline().strip() == "ready"
        store = open_store(url)
        # Hold the cross-process write lock a moment, as a busy writer would: the enqueue then
        # goes through the writer thread (and its connection) instead of running inline.
        fd = os.open(f"{db}-agentbolt-lock", os.O_RDWR | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX)
        pending = asyncio.ensure_future(store.enqueue([t.RolloutSpec(rollout_id=f"r{i}")]))
        await asyncio.sleep(0.2)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
        await pending
        await asyncio.sleep(0.05)  # the writer thread is idle when close() stops it
        await store.close()
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert await asyncio.to_thread(holder.wait, 60) == 0
        assert await asyncio.to_thread(_count_elsewhere, db) == 2 * (i + 1)
