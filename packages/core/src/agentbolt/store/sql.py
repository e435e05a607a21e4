"""``sqlite:///path.db`` and ``postgresql://...``: durable stores on SQLAlchemy 2.

One code path serves both databases; the differences are confined to connection set-up,
locking and change notification:

- **SQLite** (the embedded default): WAL journal, ``synchronous=NORMAL`` (every acknowledged
  write survives a crash of the process; use ``?synchronous=full`` to also survive power loss),
  write transactions start with ``BEGIN IMMEDIATE`` so several processes can share one file and
  two of them never claim the same rollout. Within a process all statements run on one
  dedicated thread, so asyncio tasks never contend for the file lock. Waiters notice other
  processes' commits through ``PRAGMA data_version``.
- **PostgreSQL**: a connection pool used from a thread pool; claims use
  ``SELECT ... FOR UPDATE SKIP LOCKED``; rollout rows are locked before attempt rows; waiters
  are woken by ``LISTEN``/``NOTIFY``. ``?schema=NAME`` keeps the tables in their own schema.

Status changes go through :mod:`agentbolt.store.lifecycle`, like every backend. The tables, SQL
text and row codecs are in :mod:`agentbolt.store.sql_schema`, the write lock, group commit and
listeners in :mod:`agentbolt.store.sql_engine`, spans and resources in
:mod:`agentbolt.store.sql_spans`, runs in :mod:`agentbolt.store.sql_runs`. What stays here is
the connection plumbing and the queue's operations (rollouts, attempts, leases), one
transaction function each, kept in one class so the claim/lease/finish protocol reads in one
place. Each ``_<operation>`` method implements the operation declared on
:class:`~agentbolt.store.Store` (arguments validated, defaults applied).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import sqlite3
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from .. import types as t
from ..errors import (
    InvalidTransitionError,
    MissingDependencyError,
    NotFoundError,
    StaleAttemptError,
    StoreUnavailableError,
    UserError,
)
from . import lifecycle
from .background_writes import in_background
from .base import AttemptReport, Notifier, Store, normalize_statuses
from .sql_engine import (
    _data_version,
    _GroupCommitWriter,
    _mode,
    _PgListener,
    _setup_sqlite,
    _WriteLock,
)
from .sql_runs import SqlRunsMixin, run_metadata
from .sql_schema import (
    _INSERT_ATTEMPT,
    _INSERT_ROLLOUT,
    _MIN_CHECK_INTERVAL_S,
    _RCOLS,
    _SELECT_ATTEMPTS,
    _SELECT_ROLLOUTS,
    _UPDATE_ATTEMPT,
    _UPDATE_ROLLOUT,
    SCHEMA_VERSION,
    R,
    _attempt_from,
    _attempt_insert,
    _attempt_state,
    _chunks,
    _cursor,
    _driver,
    _marks,
    _parse_url,
    _rollout_from,
    _rollout_insert,
    _rollout_state,
    _Sql,
    attempts,
    metadata,
    redact_url,
    rollouts,
    spans,
    store_meta,
)
from .sql_spans import SqlSpansMixin
from .sweeper import Sweeper

__all__ = ["SCHEMA_VERSION", "SqlStore"]

log = logging.getLogger(__name__)

_R = TypeVar("_R")


class SqlStore(SqlSpansMixin, SqlRunsMixin, Store):
    """The SQLite / PostgreSQL backend. Open it through :func:`agentbolt.store.open_store`.

    Options (keyword arguments, or query parameters of the URL):
        sweep_interval_s: background sweep period (default 1.0; 0 disables).
        synchronous: SQLite ``normal`` (default) or ``full``.
        busy_timeout_ms: SQLite lock wait across processes (default 60000).
        schema: PostgreSQL schema for the tables (created if missing).
        pool_size: PostgreSQL connections (default 8).
        clock: time source, for tests.
    """

    def __init__(
        self,
        url: str,
        *,
        sweep_interval_s: float = 1.0,
        synchronous: str | None = None,
        busy_timeout_ms: int | None = None,
        schema: str | None = None,
        pool_size: int | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.url = redact_url(url)
        self.dialect, sa_url, opts = _parse_url(url)
        self._clock = clock
        self._notifier = Notifier()
        self._closed = False
        self._listener: _PgListener | None = None
        self._listener_lock = threading.Lock()
        schema = schema or opts.get("schema")
        if self.dialect == "sqlite":
            sync = (synchronous or opts.get("synchronous") or "normal").upper()
            if sync not in ("NORMAL", "FULL"):
                raise UserError(f"synchronous must be 'normal' or 'full', not {sync.lower()!r}")
            timeout_ms = int(busy_timeout_ms or opts.get("busy_timeout_ms") or 60000)
            # The group-commit writer thread and the reader thread each keep one connection.
            self._engine = sa.create_engine(
                sa_url, poolclass=sa.pool.NullPool, connect_args={"check_same_thread": False}
            )
            _setup_sqlite(self._engine, sync, timeout_ms)
            self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="agentbolt-sqlite-read")
            self._lock_path = f"{sa.engine.make_url(sa_url).database}-agentbolt-lock"
            self._writer: _GroupCommitWriter | None = _GroupCommitWriter(self._engine, self._lock_path)
            self._channel = ""
        else:
            try:
                import psycopg  # noqa: F401
            except ImportError:
                raise MissingDependencyError("psycopg", "'agentbolt[postgres]'", "The PostgreSQL store") from None
            size = int(pool_size or opts.get("pool_size") or 8)
            kwargs: dict[str, Any] = {"pool_size": size, "max_overflow": 0, "pool_pre_ping": True}
            if schema:
                kwargs["execution_options"] = {"schema_translate_map": {None: schema}}
            self._engine = sa.create_engine(sa_url, **kwargs)
            self._executor = concurrent.futures.ThreadPoolExecutor(size, thread_name_prefix="agentbolt-pg")
            self._writer = None
            self._pg_url = sa_url
            self._channel = f"agentbolt_{schema}" if schema else "agentbolt"
        self._schema = schema
        self._q = _Sql(self.dialect, schema)
        self._known_attempts: set[tuple[str, str]] = set()  # (rollout, attempt) pairs seen valid
        self._local = threading.local()
        self._inline_conns: list[Connection] = []  # per calling thread, closed by close()
        self._inline_locks: list[_WriteLock] = []
        self._data_version: int | None = None
        try:
            self._create_schema()
        except sa.exc.OperationalError as exc:
            self._shutdown_threads()
            self._engine.dispose()
            raise StoreUnavailableError(f"cannot open store {self.url}: {exc.orig}") from exc
        self._sweeper = Sweeper(self._sweep_blocking, sweep_interval_s, name="agentbolt-sql-sweeper")

    # -- plumbing -----------------------------------------------------------------------------

    def _create_schema(self) -> None:
        # Several processes may open a new SQLite file at once: take the write lock up front
        # (BEGIN IMMEDIATE waits on busy_timeout) and retry the journal-mode switch, for which
        # SQLite does not call the busy handler.
        deadline = time.monotonic() + 60
        while True:
            try:
                self._create_schema_once()
                return
            except sa.exc.OperationalError as exc:
                if "locked" not in str(exc.orig) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def _create_schema_once(self) -> None:
        with self._engine.connect() as conn, conn.execution_options(agentbolt_write=True).begin():
            if self._schema and self.dialect == "postgresql":
                conn.exec_driver_sql(f'CREATE SCHEMA IF NOT EXISTS "{self._schema}"')
            if self.dialect == "postgresql":  # serialize concurrent first-time set-ups
                conn.exec_driver_sql("SELECT pg_advisory_xact_lock(7254100)")
            # The version check comes first: an older layout lacks columns that new indexes name.
            found = None
            in_schema = self._schema if self.dialect == "postgresql" else None
            if sa.inspect(conn).has_table("store_meta", schema=in_schema):
                found = conn.execute(sa.select(store_meta.c.value).where(store_meta.c.key == "schema_version")).scalar()
            if found is not None and int(found) != SCHEMA_VERSION:
                raise UserError(
                    f"store {self.url} has table layout version {found}; this agentbolt uses "
                    f"{SCHEMA_VERSION} (version 2 added runs and per-step metrics). agentbolt does not "
                    "migrate stores: point --store at a new database, or read this one with the agentbolt "
                    "version that wrote it."
                )
            metadata.create_all(conn, checkfirst=True)
            run_metadata.create_all(conn, checkfirst=True)
            if found is None:
                conn.execute(store_meta.insert().values(key="schema_version", value=str(SCHEMA_VERSION)))

    def _submit(self, fn: Callable[[Connection], R], *, write: bool = True) -> concurrent.futures.Future[R]:
        if self._closed:
            raise UserError("this store is closed; open a new one with open_store()")
        if write and self._writer is not None:
            return self._writer.submit(fn)
        return self._executor.submit(self._transaction, fn, write)

    async def _run(self, fn: Callable[[Connection], R], *, write: bool = True) -> R:
        if self.dialect == "sqlite" and not self._closed and not in_background():
            inline = self._run_inline(fn, write)
            if inline is not None:
                return inline[0]
        return await asyncio.wrap_future(self._submit(fn, write=write))

    def _run_inline(self, fn: Callable[[Connection], R], write: bool) -> tuple[R] | None:
        """SQLite fast path: run on the calling thread if the file lock is free right now;
        ``(result,)`` when it ran.

        Most of an operation's time is Python holding the GIL, so a worker thread buys little
        concurrency, while each hand-off between threads costs ~0.15 ms on a small VM. The
        calling thread's connection has ``busy_timeout = 0``: if another connection (the
        writer thread, another process) holds the lock, this returns ``None`` at once
        and the caller queues the operation on the writer/reader thread, which waits.
        """
        lock: _WriteLock | None = getattr(self._local, "lock", None)
        if lock is None:
            lock = self._local.lock = _WriteLock(self._lock_path)
            self._inline_locks.append(lock)
        conn = getattr(self._local, "inline", None)
        if conn is None:
            conn = self._local.inline = self._engine.connect()
            _driver(conn).execute("PRAGMA busy_timeout = 0")
            self._inline_conns.append(conn)
        if write and not lock.acquire(blocking=False):
            return None  # another writer is busy: queue behind it on the writer thread
        try:
            with conn.execution_options(agentbolt_write=write).begin():
                return (fn(conn),)
        except (sa.exc.OperationalError, sqlite3.OperationalError) as exc:
            orig = getattr(exc, "orig", exc)
            if getattr(orig, "sqlite_errorcode", None) in (5, 6) or "locked" in str(orig):
                # SQLITE_BUSY / SQLITE_LOCKED: hand over to the thread that waits. A failed BEGIN
                # can leave the connection's transaction state half-made: start afresh next time.
                conn.close()
                self._local.inline = None
                return None
            raise StoreUnavailableError(f"store {self.url}: {orig}") from exc
        finally:
            if write:
                lock.release()

    def _shutdown_threads(self) -> None:
        if self._writer is not None:
            self._writer.stop()
        self._executor.shutdown(wait=True)
        for conn in self._inline_conns:
            conn.close()
        for lock in self._inline_locks:
            lock.close()
        self._inline_conns.clear()
        self._inline_locks.clear()

    def _transaction(self, fn: Callable[[Connection], R], write: bool) -> R:
        """Run ``fn`` in its own transaction on a pooled connection (PostgreSQL, SQLite reads)."""
        for attempt in range(5):
            try:
                if self.dialect == "sqlite":  # the reader thread keeps its one connection
                    conn = getattr(self._local, "conn", None)
                    if conn is None:
                        conn = self._local.conn = self._engine.connect()
                    with conn.begin():
                        return fn(conn)
                with self._engine.connect() as conn, conn.begin():
                    return fn(conn)
            except sa.exc.IntegrityError:
                if self.dialect != "postgresql" or attempt == 4:
                    raise
            except sa.exc.OperationalError as exc:
                code = getattr(exc.orig, "sqlstate", None)
                if code in ("40001", "40P01") and attempt < 4:  # serialization failure / deadlock
                    continue
                raise StoreUnavailableError(f"store {self.url}: {exc.orig}") from exc
            log.debug("retrying a transaction that raced a concurrent writer")
        raise AssertionError("unreachable")

    def _notify_final(self, conn: Connection) -> None:
        """Wake other processes' waiters (PostgreSQL NOTIFY, sent at commit) after rollouts were
        queued or changed status. This process's waiters are woken by the caller once the
        transaction returns."""
        if self._q.pg:
            _cursor(conn).execute("SELECT pg_notify(%s, '')", (self._channel,))

    def _now(self) -> float:
        return self._clock()

    def _load_rollouts(self, conn: Connection, ids: Sequence[str], *, lock: bool = False) -> dict[str, t.Rollout]:
        """Rollouts by id (``NotFoundError`` for unknown ones); ``lock`` row-locks them in id order."""
        return self._load_by_id(conn, ids, _SELECT_ROLLOUTS, "rollout_id", _rollout_from, lock=lock)

    def _load_attempts(self, conn: Connection, ids: Sequence[str], *, lock: bool = False) -> dict[str, t.Attempt]:
        """Attempts by id (``NotFoundError`` for unknown ones); ``lock`` row-locks them in id order."""
        return self._load_by_id(conn, ids, _SELECT_ATTEMPTS, "attempt_id", _attempt_from, lock=lock)

    def _load_by_id(
        self,
        conn: Connection,
        ids: Sequence[str],
        select: str,
        key: str,
        from_row: Callable[[Any], _R],
        *,
        lock: bool,
    ) -> dict[str, _R]:
        """The rows of ``select`` whose ``key`` (its first column, ``<what>_id``) is in ``ids``, by id,
        read in chunks in id order (``NotFoundError`` naming ``<what>`` for unknown ids)."""
        out: dict[str, _R] = {}
        cur = _cursor(conn)
        for chunk in _chunks(sorted(set(ids))):
            sql = self._q(f"{select} WHERE {key} IN ({_marks(len(chunk))}) ORDER BY {key}")
            cur.execute(sql + (self._q.lock() if lock else ""), tuple(chunk))
            for row in cur.fetchall():
                out[row[0]] = from_row(row)
        missing = [i for i in ids if i not in out]
        if missing:
            raise NotFoundError(key.removesuffix("_id"), missing)
        return out

    def _save(self, conn: Connection, pairs: Sequence[tuple[t.Rollout, t.Attempt | None]]) -> None:
        if not pairs:
            return
        cur = _cursor(conn)
        cur.executemany(self._q(_UPDATE_ROLLOUT), [_rollout_state(r) for r, _ in pairs])
        changed = [_attempt_state(a) for _, a in pairs if a is not None]
        if changed:
            cur.executemany(self._q(_UPDATE_ATTEMPT), changed)

    def _expire_due(
        self, conn: Connection, found: dict[str, t.Attempt], now: float
    ) -> list[tuple[t.Rollout, t.Attempt]]:
        """Expire the due attempts among ``found`` (updated in place); rollout rows lock first."""
        due = [a.attempt_id for a in found.values() if lifecycle.expire_due(a, now)]
        if not due:
            return []
        rolls = self._load_rollouts(conn, [found[a].rollout_id for a in due], lock=True)
        if self._q.pg:  # re-read under the rollout locks: another process may have moved on
            found.update(self._load_attempts(conn, due, lock=True))
        changed = []
        for aid in sorted(due):
            res = lifecycle.expire(rolls[found[aid].rollout_id], found[aid], now)
            if res is not None:
                rolls[res[0].rollout_id], found[aid] = res
                changed.append(res)
        self._save(conn, changed)
        if changed:
            self._notify_final(conn)
        return changed

    # -- rollouts -----------------------------------------------------------------------------

    async def _enqueue(self, specs: Sequence[t.RolloutSpec]) -> list[t.Rollout]:
        specs = list(specs)
        ids = [s.rollout_id or t.new_id("ro-") for s in specs]  # Store.enqueue names every spec

        def tx(conn: Connection) -> list[t.Rollout]:
            now = self._now()
            cur = _cursor(conn)
            versions = sorted({s.resources_version for s in specs if s.resources_version is not None})
            if versions:
                cur.execute(
                    self._q(f"SELECT version FROM {{resources}} WHERE version IN ({_marks(len(versions))})"),
                    tuple(versions),
                )
                known = {row[0] for row in cur.fetchall()}
                missing = [v for v in versions if v not in known]
                if missing:
                    raise NotFoundError("resources version", missing)
            existing: dict[str, t.Rollout] = {}
            for chunk in _chunks(sorted(set(ids))):
                cur.execute(self._q(f"{_SELECT_ROLLOUTS} WHERE rollout_id IN ({_marks(len(chunk))})"), tuple(chunk))
                existing.update((row[0], _rollout_from(row)) for row in cur.fetchall())
            out, planned = lifecycle.plan_enqueue(ids, specs, existing, now)
            if planned:
                cur.executemany(self._q(_INSERT_ROLLOUT), [_rollout_insert(r) for r in planned.values()])
                self._notify_final(conn)  # wakes workers waiting in dequeue(wait_s=...)
            return out

        out = await self._run(tx)
        self._notifier.notify()
        return out

    async def _dequeue(
        self,
        worker_id: str,
        limit: int,
        lease_s: float,
        mode: t.RolloutMode | None,
        wait_s: float,
        rollout_ids: list[str] | None,
    ) -> list[t.Claim]:
        where = "status = 'queued'" + ("" if mode is None else f" AND mode = '{_mode(mode).value}'")
        wanted: tuple[str, ...] = ()
        if rollout_ids is not None:
            wanted = tuple(dict.fromkeys(rollout_ids))
            if not wanted:
                return []
            where += f" AND rollout_id IN ({_marks(len(wanted))})"
        sql = self._q(f"{_SELECT_ROLLOUTS} WHERE {where} ORDER BY id LIMIT ?") + self._q.lock(skip_locked=True)

        def tx(conn: Connection) -> list[t.Claim]:
            cur = _cursor(conn)
            cur.execute(sql, (*wanted, limit))
            rows = cur.fetchall()
            if not rows:
                return []
            now = self._now()
            cur.execute(self._q("SELECT MAX(version) FROM {resources}"))
            latest = cur.fetchone()[0]
            claims = []
            for row in rows:
                rollout, attempt = lifecycle.claim(
                    _rollout_from(row),
                    attempt_id=t.new_id("at-"),
                    worker_id=worker_id,
                    lease_s=lease_s,
                    now=now,
                    resources_version=latest,
                )
                claims.append(t.Claim.model_construct(rollout=rollout, attempt=attempt))
            cur.executemany(self._q(_INSERT_ATTEMPT), [_attempt_insert(c.attempt) for c in claims])
            cur.executemany(self._q(_UPDATE_ROLLOUT), [_rollout_state(c.rollout) for c in claims])
            return claims

        async def attempt() -> tuple[bool, list[t.Claim]]:
            claims = await self._run(tx)
            return bool(claims), claims

        return await self._wait_until(attempt, wait_s)

    async def _heartbeat(self, attempt_ids: Sequence[str], lease_s: float) -> list[t.Attempt]:
        ids = list(attempt_ids)

        def tx(conn: Connection) -> tuple[list[t.Attempt], bool]:
            now = self._now()
            found = self._load_attempts(conn, ids)
            expired = self._expire_due(conn, found, now)
            renewed = {a: lifecycle.renew(found[a], lease_s, now) for a in dict.fromkeys(ids)}
            running = [
                (x.lease_expires_at, x.heartbeat_at, a)
                for a, x in renewed.items()
                if x.status is t.AttemptStatus.RUNNING
            ]
            if running:
                _cursor(conn).executemany(
                    self._q(
                        "UPDATE {attempts} SET lease_expires_at = ?, heartbeat_at = ? WHERE attempt_id = ? AND status = 'running'"
                    ),
                    running,
                )
            if self._q.pg:  # another process may have ended an attempt meanwhile
                renewed = self._load_attempts(conn, ids)
            return [renewed[a] for a in ids], bool(expired)

        out, expired = await self._run(tx)
        if expired:
            self._notifier.notify()
        return out

    async def _finish_attempt(
        self, attempt_id: str, status: t.AttemptStatus, reward: float | None, error: t.ErrorInfo | None
    ) -> t.Rollout:
        report = AttemptReport.model_construct(attempt_id=attempt_id, status=status, reward=reward, error=error)
        (rollout,) = await self._finish([report], (), keep_expiry=True)
        return rollout

    async def _finish_attempts(self, reports: Sequence[AttemptReport], spans: Sequence[t.Span]) -> list[t.Rollout]:
        return await self._finish(reports, spans, keep_expiry=False)

    async def _finish(
        self, reports: Sequence[AttemptReport], spans: Sequence[t.Span], *, keep_expiry: bool
    ) -> list[t.Rollout]:
        """Store ``spans`` and apply ``reports`` in one transaction, all or nothing; with
        ``keep_expiry`` (one report, no spans) a report refused because its attempt's lease or
        deadline had passed still commits that expiry."""
        ids = [r.attempt_id for r in reports]
        write = self._span_write(spans) if spans else None

        def tx(conn: Connection) -> tuple[list[t.Rollout], StaleAttemptError | None]:
            now = self._now()
            found = self._load_attempts(conn, ids)
            rids = {a.rollout_id for a in found.values()}
            if write is not None and self._q.pg:  # every rollout row this locks, in one id order
                rids |= set(write.rollout_ids)
            rolls = self._load_rollouts(conn, sorted(rids), lock=True)
            if write is not None:
                write.insert(conn)
            if self._q.pg:  # re-read under the rollouts' row locks
                found = self._load_attempts(conn, ids, lock=True)
            ended, out = [], []
            for report in reports:
                attempt = found[report.attempt_id]
                rollout = rolls[attempt.rollout_id]
                expired = lifecycle.expire(rollout, attempt, now)
                if expired is not None:  # the deadline or lease passed: that is final
                    rollout, attempt = expired
                try:
                    rollout, attempt = lifecycle.finish(
                        rollout, attempt, report.status, now=now, reward=report.reward, error=report.error
                    )
                except StaleAttemptError as exc:
                    if not keep_expiry or expired is None:
                        raise
                    self._save(conn, [expired])
                    self._notify_final(conn)
                    return [], exc  # commit the expiry, then reject the report
                rolls[rollout.rollout_id], found[report.attempt_id] = rollout, attempt
                ended.append((rollout, attempt))
                out.append(rollout)
            self._save(conn, ended)
            self._notify_final(conn)
            return out, None

        out, stale = await self._run(tx)
        if write is not None:
            write.committed()
        self._notifier.notify()
        if stale is not None:
            raise stale
        return out

    async def _cancel(self, rollout_ids: Sequence[str], reason: str) -> list[t.Rollout]:
        ids = list(rollout_ids)

        def tx(conn: Connection) -> list[t.Rollout]:
            now = self._now()
            rolls = self._load_rollouts(conn, ids, lock=True)
            current = [r.current_attempt_id for r in rolls.values() if r.current_attempt_id]
            atts = self._load_attempts(conn, current, lock=True) if current else {}
            plans = {
                rid: lifecycle.cancel(r, atts.get(r.current_attempt_id or ""), now, reason) for rid, r in rolls.items()
            }
            self._save(conn, list(plans.values()))
            self._notify_final(conn)
            return [plans[r][0] for r in ids]

        out = await self._run(tx)
        self._notifier.notify()
        return out

    async def _get_rollouts(self, rollout_ids: Sequence[str]) -> list[t.Rollout]:
        ids = list(rollout_ids)

        def tx(conn: Connection) -> list[t.Rollout]:
            found = self._load_rollouts(conn, ids)
            return [found[r] for r in ids]

        return await self._run(tx, write=False)

    async def _get_attempts(self, rollout_id: str) -> list[t.Attempt]:
        # SQL text on the driver's cursor (see sql_schema): the gateway re-checks the attempts
        # it serves with this every few seconds, on its event loop.
        def tx(conn: Connection) -> list[t.Attempt]:
            cur = _cursor(conn)
            cur.execute(self._q("SELECT 1 FROM {rollouts} WHERE rollout_id = ?"), (rollout_id,))
            if cur.fetchone() is None:
                raise NotFoundError("rollout", [rollout_id])
            cur.execute(self._q(f"{_SELECT_ATTEMPTS} WHERE rollout_id = ? ORDER BY idx"), (rollout_id,))
            return [_attempt_from(r) for r in cur.fetchall()]

        return await self._run(tx, write=False)

    async def _query_rollouts(
        self,
        status: t.RolloutStatus | Sequence[t.RolloutStatus] | None,
        mode: t.RolloutMode | None,
        group_id: str | None,
        limit: int,
        cursor: str | None,
    ) -> t.Page[t.Rollout]:
        statuses = normalize_statuses(status)
        try:
            after = int(cursor) if cursor is not None else 0
        except ValueError:
            raise UserError(f"invalid cursor {cursor!r}; pass back a Page.next_cursor unchanged") from None

        def tx(conn: Connection) -> t.Page[t.Rollout]:
            stmt = sa.select(*(rollouts.c[c] for c in _RCOLS), rollouts.c.id).where(rollouts.c.id > after)
            if statuses is not None:
                stmt = stmt.where(rollouts.c.status.in_([s.value for s in statuses]))
            if mode is not None:
                stmt = stmt.where(rollouts.c.mode == _mode(mode).value)
            if group_id is not None:
                stmt = stmt.where(rollouts.c.group_id == group_id)
            rows = conn.execute(stmt.order_by(rollouts.c.id).limit(limit + 1)).all()
            more = len(rows) > limit
            rows = rows[:limit]
            return t.Page(items=[_rollout_from(r) for r in rows], next_cursor=str(rows[-1][-1]) if more else None)

        return await self._run(tx, write=False)

    async def _count_rollouts(self, group_id: str | None) -> dict[t.RolloutStatus, int]:
        def tx(conn: Connection) -> dict[t.RolloutStatus, int]:
            stmt = sa.select(rollouts.c.status, sa.func.count()).group_by(rollouts.c.status)
            if group_id is not None:
                stmt = stmt.where(rollouts.c.group_id == group_id)
            counts = dict.fromkeys(t.RolloutStatus, 0)
            for status, n in conn.execute(stmt):
                counts[t.RolloutStatus(status)] = n
            return counts

        return await self._run(tx, write=False)

    async def _wait_for_rollouts(self, rollout_ids: Sequence[str], timeout: float | None) -> list[t.Rollout]:
        pending = list(dict.fromkeys(rollout_ids))

        def statuses(conn: Connection) -> dict[str, str]:
            cur = _cursor(conn)
            found: dict[str, str] = {}
            for chunk in _chunks(pending):
                cur.execute(
                    self._q(f"SELECT rollout_id, status FROM {{rollouts}} WHERE rollout_id IN ({_marks(len(chunk))})"),
                    tuple(chunk),
                )
                found.update(cur.fetchall())
            return found

        async def check() -> tuple[bool, None]:
            # Only the unfinished ones, status only: waiting on a large batch stays cheap.
            nonlocal pending
            found = await self._run(statuses, write=False)
            missing = [r for r in pending if r not in found]
            if missing:
                raise NotFoundError("rollout", missing)
            pending = [r for r in pending if not t.RolloutStatus(found[r]).is_final]
            return not pending, None

        await self._wait_until(check, timeout)
        return await self.get_rollouts(rollout_ids)

    async def _wait_until(self, check: Callable[[], Awaitable[tuple[bool, R]]], timeout: float | None) -> R:
        """Re-run ``check`` on every change (at most every 20 ms) until done or ``timeout`` passes."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        if self.dialect == "postgresql":
            self._ensure_listener()
        last = -1.0
        while True:
            fut = self._notifier.future()  # registered before checking: no change is missed
            gap = last + _MIN_CHECK_INTERVAL_S - loop.time()
            if gap > 0:  # a burst of changes: coalesce them into one check
                await asyncio.sleep(gap)
            last = loop.time()
            done, value = await check()
            remaining = None if deadline is None else deadline - loop.time()
            if done or (remaining is not None and remaining <= 0):
                self._notifier.discard(fut)
                return value
            await self._wait_for_change(fut, remaining)

    async def _wait_for_change(self, fut: asyncio.Future[None], remaining: float | None) -> None:
        """Return on a notification, another process's commit, or after a bounded wait."""
        loop = asyncio.get_running_loop()
        cap = 5.0 if remaining is None else min(remaining, 5.0)
        if self.dialect == "postgresql":  # NOTIFY wakes us; the cap bounds a lost notification
            await self._notifier.wait(fut, cap)
            return
        # SQLite: PRAGMA data_version changes when another connection commits; checking it is a
        # read of one page header, not a query over the rollouts.
        end = loop.time() + cap
        try:
            while not fut.done() and loop.time() < end:
                version = await self._run(_data_version, write=False)
                if self._data_version is not None and version != self._data_version:
                    self._data_version = version
                    return
                self._data_version = version
                await asyncio.wait([fut], timeout=min(0.05, max(end - loop.time(), 0)))
        finally:
            self._notifier.discard(fut)

    async def _purge(self, rollout_ids: Sequence[str] | None, older_than_s: float | None) -> int:

        def tx(conn: Connection) -> int:
            chosen: list[str] = []
            if rollout_ids is not None:
                for r in self._load_rollouts(conn, list(rollout_ids), lock=True).values():
                    if not r.status.is_final:
                        raise InvalidTransitionError(
                            f"rollout {r.rollout_id} is {r.status.value}; cancel it before purging"
                        )
                chosen.extend(dict.fromkeys(rollout_ids))
            if older_than_s is not None:
                cutoff = self._now() - older_than_s
                rows = conn.execute(
                    sa.select(rollouts.c.rollout_id).where(
                        rollouts.c.status.in_(["succeeded", "failed", "cancelled"]), rollouts.c.ended_at <= cutoff
                    )
                ).scalars()
                seen = set(chosen)
                chosen.extend(r for r in rows if r not in seen)
            for chunk in _chunks(chosen):
                keys = sa.select(rollouts.c.id).where(rollouts.c.rollout_id.in_(chunk)).scalar_subquery()
                conn.execute(spans.delete().where(spans.c.rkey.in_(keys)))
                conn.execute(attempts.delete().where(attempts.c.rollout_id.in_(chunk)))
                conn.execute(rollouts.delete().where(rollouts.c.rollout_id.in_(chunk)))
            return len(chosen)

        return await self._run(tx)

    # -- maintenance --------------------------------------------------------------------------

    def _sweep_tx(self, conn: Connection) -> int:
        now = self._now()
        cur = _cursor(conn)
        cur.execute(
            self._q(
                "SELECT attempt_id FROM {attempts} WHERE status = 'running' AND (lease_expires_at <= ? OR deadline_at <= ?) LIMIT 1000"
            ),
            (now, now),
        )
        due = [row[0] for row in cur.fetchall()]
        return len(self._expire_due(conn, self._load_attempts(conn, due), now)) if due else 0

    def _sweep_blocking(self) -> int:
        if self._closed:
            return 0
        ended = self._submit(self._sweep_tx).result()
        if ended:
            self._notifier.notify()
        return ended

    async def _sweep(self) -> int:
        ended = await self._run(self._sweep_tx)
        if ended:
            self._notifier.notify()
        return ended

    def _ensure_listener(self) -> None:
        with self._listener_lock:
            if self._listener is None and not self._closed:
                self._listener = _PgListener(self._pg_url, self._channel, self._notifier)

    async def close(self) -> None:
        if self._closed:
            return
        self._sweeper.stop()
        self._closed = True
        if self._listener is not None:
            self._listener.stop()
        self._shutdown_threads()
        self._engine.dispose()
