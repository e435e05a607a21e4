"""The SQL store's tables, its hot-path SQL text and the row codecs, shared by
:class:`~agentbolt.store.sql.SqlStore` and its runs part (:mod:`agentbolt.store.sql_runs`).

Names with a leading underscore are private to the ``agentbolt.store`` package.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from .. import types as t
from ..errors import (
    StoreUnavailableError,
    UserError,
)

__all__ = ["SCHEMA_VERSION", "metadata", "redact_url", "span_key"]

R = TypeVar("R")

SCHEMA_VERSION = 2
"""Version of the table layout below; stored in ``store_meta``. 2: runs, run metrics, and the
rollouts' ``run_id`` / ``step`` columns."""

_IN_CHUNK = 500  # ids per IN (...) list
_GROUP_COMMIT_MAX = 64
_MIN_CHECK_INTERVAL_S = (
    0.02  # waiters re-check at most this often  # SQLite write operations committed together at most
)

metadata = sa.MetaData()

rollouts = sa.Table(
    "rollouts",
    metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
    sa.Column("rollout_id", sa.String, nullable=False, unique=True),
    sa.Column("task_id", sa.String),
    sa.Column("input", sa.Text, nullable=False),
    sa.Column("mode", sa.String(8), nullable=False),
    sa.Column("group_id", sa.String),
    sa.Column("resources_version", sa.Integer),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("attempt_count", sa.Integer, nullable=False),
    sa.Column("max_attempts", sa.Integer, nullable=False),
    sa.Column("timeout_s", sa.Float),
    sa.Column("final_reward", sa.Float),
    sa.Column("error", sa.Text),
    sa.Column("current_attempt_id", sa.String),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("started_at", sa.Float),
    sa.Column("ended_at", sa.Float),
    sa.Column("updated_at", sa.Float, nullable=False),
    sa.Column("metadata", sa.Text, nullable=False),
    sa.Column("span_seq", sa.Integer, nullable=False, server_default="0"),
    sa.Column("run_id", sa.String),
    sa.Column("step", sa.Integer),
    # Few indexes on purpose: each one is rewritten on every status change. (status, id) serves
    # the queue (status = 'queued' ORDER BY id) and status queries; purge-by-age scans.
    sa.Index("ix_rollouts_status_id", "status", "id"),
    sa.Index("ix_rollouts_group", "group_id", "id"),
    sa.Index("ix_rollouts_run_step", "run_id", "step", "id"),  # the dashboard's per-run queries
)

attempts = sa.Table(
    "attempts",
    metadata,
    sa.Column("attempt_id", sa.String, primary_key=True),
    sa.Column("rollout_id", sa.String, nullable=False, index=True),
    sa.Column("idx", sa.Integer, nullable=False),
    sa.Column("worker_id", sa.String, nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("lease_expires_at", sa.Float),
    sa.Column("deadline_at", sa.Float),
    sa.Column("started_at", sa.Float, nullable=False),
    sa.Column("heartbeat_at", sa.Float),
    sa.Column("ended_at", sa.Float),
    sa.Column("error", sa.Text),
    sa.Index(
        "ix_attempts_running",
        "lease_expires_at",
        sqlite_where=sa.text("status = 'running'"),
        postgresql_where=sa.text("status = 'running'"),
    ),
)

# Append-only rows with a single secondary index: (rollout key, span key) enforces idempotency
# and serves per-rollout queries (sorted by seq after the index lookup). Every extra index
# roughly halves ingest speed, because each commit writes every index page it touched; integer
# keys (the rollout's row id, the 64-bit span id) keep that index small.
spans = sa.Table(
    "spans",
    metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
    sa.Column("rkey", sa.BigInteger, nullable=False),  # rollouts.id
    sa.Column("seq", sa.Integer, nullable=False),
    sa.Column("skey", sa.BigInteger, nullable=False),  # span id as a signed 64-bit integer
    sa.Column("attempt_id", sa.String),
    sa.Column("body", sa.Text, nullable=False),
    sa.UniqueConstraint("rkey", "skey", name="uq_spans_rollout_span"),
)

resources = sa.Table(
    "resources",
    metadata,
    sa.Column("version", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("body", sa.Text, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
)

store_meta = sa.Table(
    "store_meta",
    metadata,
    sa.Column("key", sa.String, primary_key=True),
    sa.Column("value", sa.String, nullable=False),
)

# --- hot path: raw DBAPI cursors --------------------------------------------------------------
#
# Core statements cost 50-230 us each in Python on a small machine (cache keys, compilation,
# result processing); a raw cursor on the same connection and transaction costs ~13 us. The
# operations every rollout goes through (claim, heartbeat, finish, spans, reads by id) therefore
# use SQL text on the driver connection, written once with ``?`` placeholders and ``{table}``
# names and translated per dialect by :class:`_Sql`. Everything else uses Core.

_RCOLS = (
    "rollout_id", "task_id", "input", "mode", "group_id", "resources_version", "status",
    "attempt_count", "max_attempts", "timeout_s", "final_reward", "error", "current_attempt_id",
    "created_at", "started_at", "ended_at", "updated_at", "metadata", "run_id", "step",
)  # fmt: skip
_ACOLS = (
    "attempt_id", "rollout_id", "idx", "worker_id", "status", "lease_expires_at", "deadline_at",
    "started_at", "heartbeat_at", "ended_at", "error",
)  # fmt: skip
_RSTATE = (
    "resources_version", "status", "attempt_count", "final_reward", "error", "current_attempt_id",
    "started_at", "ended_at", "updated_at",
)  # fmt: skip
_ASTATE = ("status", "lease_expires_at", "heartbeat_at", "ended_at", "error")

_SELECT_ROLLOUTS = f"SELECT {', '.join(_RCOLS)} FROM {{rollouts}}"
_SELECT_ATTEMPTS = f"SELECT {', '.join(_ACOLS)} FROM {{attempts}}"
_INSERT_ROLLOUT = f"INSERT INTO {{rollouts}} ({', '.join(_RCOLS)}) VALUES ({', '.join('?' * len(_RCOLS))})"
_INSERT_ATTEMPT = f"INSERT INTO {{attempts}} ({', '.join(_ACOLS)}) VALUES ({', '.join('?' * len(_ACOLS))})"
_UPDATE_ROLLOUT = f"UPDATE {{rollouts}} SET {', '.join(c + ' = ?' for c in _RSTATE)} WHERE rollout_id = ?"
_UPDATE_ATTEMPT = f"UPDATE {{attempts}} SET {', '.join(c + ' = ?' for c in _ASTATE)} WHERE attempt_id = ?"
_INSERT_SPAN = (
    "INSERT INTO {spans} (rkey, seq, skey, attempt_id, body) VALUES (?, ?, ?, ?, ?) ON CONFLICT (rkey, skey) DO NOTHING"
)

_INSERT_SPAN_WITH_ID = (
    "INSERT INTO {spans} (id, rkey, seq, skey, attempt_id, body) VALUES (?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (rkey, skey) DO NOTHING"
)


def span_key(span_id: str) -> int:
    """A 16-hex-digit span id as the signed 64-bit integer stored in ``spans.skey``."""
    return int(span_id, 16) - (1 << 63)


class _Sql:
    """SQL text for one dialect and schema: ``?`` -> ``%s`` for psycopg, qualified table names."""

    def __init__(self, dialect: str, schema: str | None) -> None:
        self.pg = dialect == "postgresql"
        prefix = f'"{schema}".' if schema and self.pg else ""
        self._tables = {name: prefix + name for name in ("rollouts", "attempts", "spans", "resources")}
        self._cache: dict[str, str] = {}

    def __call__(self, template: str) -> str:
        text = self._cache.get(template)
        if text is None:
            text = template.format(**self._tables)
            if self.pg:
                text = text.replace("?", "%s")
            self._cache[template] = text
        return text

    def lock(self, skip_locked: bool = False) -> str:
        """Row-lock suffix for SELECTs (SQLite's write transaction already excludes others)."""
        if not self.pg:
            return ""
        return " FOR UPDATE SKIP LOCKED" if skip_locked else " FOR UPDATE"


def _driver(conn: Connection) -> Any:
    """The DBAPI connection (sqlite3's or psycopg's) under ``conn``."""
    raw = conn.connection.driver_connection
    if raw is None:  # SQLAlchemy drops it only when the connection was invalidated
        raise StoreUnavailableError("the database connection was invalidated; retry the call")
    return raw


def _cursor(conn: Connection) -> Any:
    """A DBAPI cursor on the connection's current transaction."""
    return _driver(conn).cursor()


def _marks(n: int) -> str:
    return ", ".join("?" * n)


def _error_json(error: t.ErrorInfo | None) -> str | None:
    return None if error is None else error.model_dump_json()


def _error_from(text: str | None) -> t.ErrorInfo | None:
    return None if text is None else t.ErrorInfo.model_validate_json(text)


def _rollout_insert(r: t.Rollout) -> tuple[Any, ...]:
    return (
        r.rollout_id, r.task_id, orjson.dumps(r.input).decode(), r.mode.value, r.group_id,
        r.resources_version, r.status.value, r.attempt_count, r.max_attempts, r.timeout_s,
        r.final_reward, _error_json(r.error), r.current_attempt_id, r.created_at, r.started_at,
        r.ended_at, r.updated_at, orjson.dumps(r.metadata).decode(), r.run_id, r.step,
    )  # fmt: skip


def _rollout_state(r: t.Rollout) -> tuple[Any, ...]:
    return (
        r.resources_version, r.status.value, r.attempt_count, r.final_reward, _error_json(r.error),
        r.current_attempt_id, r.started_at, r.ended_at, r.updated_at, r.rollout_id,
    )  # fmt: skip


def _rollout_from(row: Sequence[Any]) -> t.Rollout:
    # Rows come from our own writes, so the model is constructed without re-validation.
    return t.Rollout.model_construct(
        rollout_id=row[0],
        task_id=row[1],
        input=orjson.loads(row[2]),
        mode=t.RolloutMode(row[3]),
        group_id=row[4],
        resources_version=row[5],
        status=t.RolloutStatus(row[6]),
        attempt_count=row[7],
        max_attempts=row[8],
        timeout_s=row[9],
        final_reward=row[10],
        error=_error_from(row[11]),
        current_attempt_id=row[12],
        created_at=row[13],
        started_at=row[14],
        ended_at=row[15],
        updated_at=row[16],
        metadata=orjson.loads(row[17]),
        run_id=row[18],
        step=row[19],
    )


def _attempt_insert(a: t.Attempt) -> tuple[Any, ...]:
    return (
        a.attempt_id, a.rollout_id, a.index, a.worker_id, a.status.value, a.lease_expires_at,
        a.deadline_at, a.started_at, a.heartbeat_at, a.ended_at, _error_json(a.error),
    )  # fmt: skip


def _attempt_state(a: t.Attempt) -> tuple[Any, ...]:
    return (a.status.value, a.lease_expires_at, a.heartbeat_at, a.ended_at, _error_json(a.error), a.attempt_id)


def _attempt_from(row: Sequence[Any]) -> t.Attempt:
    return t.Attempt.model_construct(
        attempt_id=row[0],
        rollout_id=row[1],
        index=row[2],
        worker_id=row[3],
        status=t.AttemptStatus(row[4]),
        lease_expires_at=row[5],
        deadline_at=row[6],
        started_at=row[7],
        heartbeat_at=row[8],
        ended_at=row[9],
        error=_error_from(row[10]),
    )


def _chunks(items: Sequence[R], size: int = _IN_CHUNK) -> Iterable[Sequence[R]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


# --- URL handling -------------------------------------------------------------------------------


def _parse_url(url: str) -> tuple[str, str, dict[str, str]]:
    """(dialect, SQLAlchemy URL, our options) for a store URL."""
    parts = urlsplit(url)
    scheme = parts.scheme.split("+", 1)[0]
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    ours: dict[str, str] = {
        k: query.pop(k) for k in ("schema", "synchronous", "busy_timeout_ms", "pool_size") if k in query
    }
    rest = urlencode(query)
    if scheme == "sqlite":
        path = parts.path
        if not path or path in ("/", "/:memory:") or parts.netloc not in ("",):
            raise UserError(
                f"invalid SQLite store URL {url!r}: use sqlite:///relative/path.db or "
                "sqlite:////absolute/path.db (for a throwaway store use memory://)"
            )
        database = path[1:]  # sqlite:///rel.db -> "rel.db"; sqlite:////abs.db -> "/abs.db"
        return "sqlite", f"sqlite+pysqlite:///{database}" + (f"?{rest}" if rest else ""), ours
    if scheme in ("postgresql", "postgres"):
        return "postgresql", urlunsplit(("postgresql+psycopg", parts.netloc, parts.path, rest, "")), ours
    raise UserError(f"SqlStore handles sqlite:// and postgresql:// URLs, not {url!r}")


def redact_url(url: str) -> str:
    """The URL without a password."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
