"""Connection-level machinery of the SQL store: the cross-process write lock and group commit
for SQLite, SQLite's connection set-up, PostgreSQL's ``LISTEN`` listener, error mapping.

Names with a leading underscore are private to the ``agentbolt.store`` package.
"""

from __future__ import annotations

import concurrent.futures
import fcntl
import logging
import os
import queue
import sqlite3
import threading
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

from .. import types as t
from ..errors import (
    StoreUnavailableError,
    UserError,
)
from .base import Notifier
from .sql_schema import _GROUP_COMMIT_MAX, R, _cursor, _driver

log = logging.getLogger(__name__)


class _WriteLock:
    """An exclusive ``flock`` on ``<database>-agentbolt-lock`` taken around every write.

    SQLite's busy handler polls with growing sleeps (1, 2, 5 ... 100 ms), so writers of several
    processes contending for the file lock wait far longer than the lock is held. ``flock``
    waiters are woken by the kernel the moment it is released. Each thread opens its own
    descriptor: ``flock`` then also excludes threads of the same process. Processes that do not
    use agentbolt are still coordinated by SQLite's own lock and ``busy_timeout``.
    """

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)

    def acquire(self, *, blocking: bool) -> bool:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            return False
        return True

    def release(self) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        os.close(self._fd)


class _GroupCommitWriter:
    """SQLite's single writer: runs queued write operations on one thread, committing the
    operations that queued up meanwhile in one transaction (group commit).

    Each operation runs inside its own SAVEPOINT, so one that raises is rolled back alone and
    gets its exception; the others commit. Nothing is acknowledged before its COMMIT returns,
    so every acknowledged write survives a crash of the process.
    """

    def __init__(self, engine: Engine, lock_path: str) -> None:
        self._engine = engine
        self._lock = _WriteLock(lock_path)
        self._conn: Connection | None = None  # owned by the writer thread
        self._queue: queue.SimpleQueue[tuple[Callable[[Connection], Any], concurrent.futures.Future[Any]] | None]
        self._queue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="agentbolt-sqlite-write", daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[Connection], R]) -> concurrent.futures.Future[R]:
        fut: concurrent.futures.Future[R] = concurrent.futures.Future()
        self._queue.put((fn, fut))
        return fut

    def stop(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                break
            batch = [item]
            stop = False
            while len(batch) < _GROUP_COMMIT_MAX:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                    break
                batch.append(more)
            self._run_batch(batch)
            if stop:
                break
        if self._conn is not None:
            self._conn.close()
        self._lock.close()

    def _run_batch(self, batch: list[tuple[Callable[[Connection], Any], concurrent.futures.Future[Any]]]) -> None:
        results: list[tuple[concurrent.futures.Future[Any], Any, BaseException | None]] = []
        self._lock.acquire(blocking=True)
        try:
            if self._conn is None:
                self._conn = self._engine.connect().execution_options(agentbolt_write=True)
            conn = self._conn
            with conn.begin() as tx:
                raw = _driver(conn)
                for fn, fut in batch:
                    # Raw SAVEPOINTs: SQLAlchemy's nested transactions cost ~0.2 ms each here.
                    if len(batch) > 1:
                        raw.execute("SAVEPOINT agentbolt_op")
                    try:
                        value = fn(conn)
                    except Exception as exc:  # this operation alone is undone
                        if len(batch) > 1:
                            raw.execute("ROLLBACK TO agentbolt_op")
                            raw.execute("RELEASE agentbolt_op")
                        else:
                            tx.rollback()
                        results.append((fut, None, exc))
                    else:
                        if len(batch) > 1:
                            raw.execute("RELEASE agentbolt_op")
                        results.append((fut, value, None))
        except Exception as exc:  # BEGIN or COMMIT failed: nothing of the batch was applied
            if isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated and self._conn is not None:
                self._conn.close()
                self._conn = None
            error = _as_store_error(exc)
            results = [(fut, None, error) for _, fut in batch]
        finally:
            self._lock.release()
        for fut, value, failure in results:
            if failure is not None:
                fut.set_exception(failure)
            else:
                fut.set_result(value)


def _as_store_error(exc: BaseException) -> BaseException:
    if isinstance(exc, sa.exc.OperationalError | sqlite3.OperationalError):
        return StoreUnavailableError(f"SQLite write failed: {getattr(exc, 'orig', exc)}")
    return exc


def _mode(mode: Any) -> t.RolloutMode:
    try:
        return t.RolloutMode(mode)
    except ValueError:
        raise UserError(f"invalid mode {mode!r}; valid modes: {', '.join(m.value for m in t.RolloutMode)}") from None


def _data_version(conn: Connection) -> int:
    cur = _cursor(conn)
    cur.execute("PRAGMA data_version")
    return int(cur.fetchone()[0])


def _setup_sqlite(engine: Engine, synchronous: str, busy_timeout_ms: int) -> None:
    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        cur.execute("PRAGMA journal_mode = WAL")
        cur.execute(f"PRAGMA synchronous = {synchronous}")
        cur.execute("PRAGMA foreign_keys = ON")
        cur.execute("PRAGMA cache_size = -65536")  # 64 MiB: index pages stay cached as the file grows
        cur.execute("PRAGMA mmap_size = 268435456")
        cur.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        # BEGIN IMMEDIATE takes the write lock up front, so a write transaction never fails
        # half-way on a lock upgrade; other connections wait up to busy_timeout, except the
        # inline fast path, which must not wait on the event loop.
        raw = _driver(conn)
        raw.execute("BEGIN IMMEDIATE" if conn.get_execution_options().get("agentbolt_write") else "BEGIN")


class _PgListener:
    """A thread holding a LISTEN connection; each NOTIFY wakes this process's waiters."""

    def __init__(self, sa_url: str, channel: str, notifier: Notifier) -> None:
        import psycopg

        self._conninfo = sa.engine.make_url(sa_url).set(drivername="postgresql").render_as_string(hide_password=False)
        self._channel = channel
        self._notifier = notifier
        self._stop = threading.Event()
        self._psycopg = psycopg
        self._thread = threading.Thread(target=self._run, name="agentbolt-pg-listen", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with self._psycopg.connect(self._conninfo, autocommit=True) as conn:
                    conn.execute(f'LISTEN "{self._channel}"')
                    while not self._stop.is_set():
                        for _ in conn.notifies(timeout=0.5, stop_after=1):
                            self._notifier.notify()
            except Exception as exc:  # reconnect; waiters still wake on their bounded timeout
                if self._stop.is_set():
                    return
                log.warning("PostgreSQL LISTEN connection failed (%s); retrying", exc)
                self._stop.wait(1.0)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
