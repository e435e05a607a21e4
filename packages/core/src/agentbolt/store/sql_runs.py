"""Runs, metrics, searches and health for :class:`~agentbolt.store.sql.SqlStore` (SQLite, PostgreSQL).

The tables live in their own :data:`run_metadata`, created beside the rollout tables. Searches
use the rollouts' ``(run_id, step, id)`` index; none of this is on the rollouts' hot path, so it
uses SQLAlchemy Core throughout.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from .. import types as t
from ..errors import ConflictError, NotFoundError
from . import run_common
from .run_records import (
    RolloutSearch,
    RolloutSearchPage,
    Run,
    RunMetrics,
    RunnerSeen,
    RunSpec,
    RunStatus,
    StoreHealth,
)
from .sql_schema import _SELECT_ROLLOUTS, _cursor, _rollout_from, attempts, rollouts

if TYPE_CHECKING:
    from .sql_schema import _Sql

__all__ = ["SqlRunsMixin", "run_metadata"]

R = TypeVar("R")

run_metadata = sa.MetaData()

runs = sa.Table(
    "runs",
    run_metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
    sa.Column("run_id", sa.String, nullable=False, unique=True),
    sa.Column("name", sa.String),
    sa.Column("algorithm", sa.String, nullable=False),
    sa.Column("model", sa.String),
    sa.Column("config", sa.Text, nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("error", sa.Text),
    sa.Column("started_at", sa.Float, nullable=False),
    sa.Column("ended_at", sa.Float),
    sa.Column("steps", sa.Integer, nullable=False),
    sa.Column("latest", sa.Text, nullable=False),
)

run_metrics = sa.Table(
    "run_metrics",
    run_metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
    sa.Column("run_key", sa.BigInteger, nullable=False),  # runs.id
    sa.Column("step", sa.Integer, nullable=False),
    sa.Column("time", sa.Float, nullable=False),
    sa.Column("run_values", sa.Text, nullable=False),
    sa.Index("ix_run_metrics_run", "run_key", "id"),
)


def _run_from(row: Any) -> Run:
    return Run(
        run_id=row.run_id,
        name=row.name,
        algorithm=row.algorithm,
        model=row.model,
        config=orjson.loads(row.config),
        status=RunStatus(row.status),
        error=row.error,
        started_at=row.started_at,
        ended_at=row.ended_at,
        steps=row.steps,
        latest=orjson.loads(row.latest),
    )


class SqlRunsMixin:
    """Mixed into ``SqlStore``; uses its transaction runner and clock."""

    dialect: str
    _q: _Sql

    if TYPE_CHECKING:  # SqlStore's, for the type checker only

        def _run(self, fn: Callable[[Connection], R], *, write: bool = True) -> Awaitable[R]: ...

        def _now(self) -> float: ...

    @staticmethod
    def _load_run(conn: Connection, run_id: str, *, lock: bool = False) -> Any:
        stmt = sa.select(runs).where(runs.c.run_id == run_id)
        if lock and conn.dialect.name == "postgresql":
            stmt = stmt.with_for_update()
        row = conn.execute(stmt).first()
        if row is None:
            raise NotFoundError("run", run_id)
        return row

    async def _start_run(self, spec: RunSpec) -> Run:
        def tx(conn: Connection) -> Run:
            run = run_common.new_run(spec, self._now())
            if conn.execute(sa.select(runs.c.id).where(runs.c.run_id == run.run_id)).first() is not None:
                raise ConflictError(f"run {run.run_id} already exists; use a new run_id")
            conn.execute(
                runs.insert().values(
                    run_id=run.run_id,
                    name=run.name,
                    algorithm=run.algorithm,
                    model=run.model,
                    config=orjson.dumps(run.config).decode(),
                    status=run.status.value,
                    started_at=run.started_at,
                    steps=0,
                    latest="{}",
                )
            )
            return run

        return await self._run(tx)

    async def _finish_run(self, run_id: str, status: RunStatus, error: str | None) -> Run:
        def tx(conn: Connection) -> Run:
            run = run_common.finished_run(
                _run_from(self._load_run(conn, run_id, lock=True)), status, error, self._now()
            )
            conn.execute(
                runs.update()
                .where(runs.c.run_id == run_id)
                .values(status=run.status.value, error=run.error, ended_at=run.ended_at)
            )
            return run

        return await self._run(tx)

    async def _get_run(self, run_id: str) -> Run:
        return await self._run(lambda conn: _run_from(self._load_run(conn, run_id)), write=False)

    async def _list_runs(self, limit: int) -> list[Run]:

        def tx(conn: Connection) -> list[Run]:
            return [_run_from(row) for row in conn.execute(sa.select(runs).order_by(runs.c.id.desc()).limit(limit))]

        return await self._run(tx, write=False)

    async def _add_run_metrics(self, run_id: str, step: int, values: Mapping[str, float]) -> RunMetrics:
        clean = dict(values)  # checked by RunStore.add_run_metrics

        def tx(conn: Connection) -> RunMetrics:
            row = self._load_run(conn, run_id, lock=True)
            now = self._now()
            seq = conn.execute(
                run_metrics.insert()
                .values(run_key=row.id, step=int(step), time=now, run_values=orjson.dumps(clean).decode())
                .returning(run_metrics.c.id)
            ).scalar_one()
            latest = {**orjson.loads(row.latest), **clean}
            conn.execute(
                runs.update()
                .where(runs.c.id == row.id)
                .values(steps=max(row.steps, int(step)), latest=orjson.dumps(latest).decode())
            )
            return RunMetrics(run_id=run_id, seq=seq, step=int(step), time=now, values=clean)

        return await self._run(tx)

    async def _get_run_metrics(self, run_id: str, after_seq: int | None) -> list[RunMetrics]:

        def tx(conn: Connection) -> list[RunMetrics]:
            key = self._load_run(conn, run_id).id
            stmt = sa.select(run_metrics).where(run_metrics.c.run_key == key)
            if after_seq is not None:
                stmt = stmt.where(run_metrics.c.id > after_seq)
            return [
                RunMetrics(run_id=run_id, seq=r.id, step=r.step, time=r.time, values=orjson.loads(r.run_values))
                for r in conn.execute(stmt.order_by(run_metrics.c.id))
            ]

        return await self._run(tx, write=False)

    async def _search_rollouts(self, query: RolloutSearch) -> RolloutSearchPage:

        c = rollouts.c
        where: list[Any] = []
        if query.run_id is not None:
            where.append(c.run_id == query.run_id)
        if query.step is not None:
            where.append(c.step == query.step)
        if query.status:
            where.append(c.status.in_([s.value for s in query.status]))
        if query.mode is not None:
            where.append(c.mode == t.RolloutMode(query.mode).value)
        if query.reward_min is not None:
            where.append(c.final_reward >= query.reward_min)
        if query.reward_max is not None:
            where.append(c.final_reward <= query.reward_max)
        if query.failure_kind is not None:
            where.append(c.error.like(run_common.error_kind_prefix(query.failure_kind) + "%"))
        if query.text is not None:
            pattern = "%" + query.text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            where.append(sa.or_(c.task_id.ilike(pattern, escape="\\"), c.input.ilike(pattern, escape="\\")))

        def tx(conn: Connection) -> RolloutSearchPage:
            total = conn.execute(sa.select(sa.func.count()).select_from(rollouts).where(*where)).scalar_one()
            ids = sa.select(c.id).where(*where).order_by(c.id.desc()).limit(query.limit).offset(query.offset)
            keys = [row[0] for row in conn.execute(ids)]
            items: list[t.Rollout] = []
            if keys:
                cur = _cursor(conn)
                marks = ", ".join("?" * len(keys))
                cur.execute(self._q(f"{_SELECT_ROLLOUTS} WHERE id IN ({marks}) ORDER BY id DESC"), tuple(keys))
                items = [_rollout_from(row) for row in cur.fetchall()]
            return RolloutSearchPage(items=items, total=total)

        return await self._run(tx, write=False)

    async def _store_health(self) -> StoreHealth:

        def tx(conn: Connection) -> StoreHealth:
            now = self._now()
            r, a = rollouts.c, attempts.c
            by_status = dict.fromkeys(t.RolloutStatus, 0)
            for status, n in conn.execute(sa.select(r.status, sa.func.count()).group_by(r.status)):
                by_status[t.RolloutStatus(status)] = n
            attempt_counts = dict.fromkeys(t.AttemptStatus, 0)
            for status, n in conn.execute(sa.select(a.status, sa.func.count()).group_by(a.status)):
                attempt_counts[t.AttemptStatus(status)] = n
            expired = conn.execute(
                sa.select(sa.func.count()).where(a.status == "running", a.lease_expires_at <= now)
            ).scalar_one()
            failures: dict[str, int] = {}
            # The (status, id) index finds the failed rows; the kind is the start of the error JSON.
            head = sa.func.substr(r.error, 1, 40)
            for text, n in conn.execute(
                sa.select(head, sa.func.count())
                .where(r.status.in_(["failed", "cancelled"]), r.error.is_not(None))
                .group_by(head)
            ):
                kind = next((k.value for k in t.ErrorKind if text.startswith(run_common.error_kind_prefix(k))), "other")
                failures[kind] = failures.get(kind, 0) + n
            retried, retries = conn.execute(
                sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(r.attempt_count - 1), 0)).where(
                    r.attempt_count > 1
                )
            ).one()
            runners = [
                RunnerSeen(worker_id=w, attempts=n, running=int(running or 0), last_seen=float(last or 0.0))
                for w, n, running, last in conn.execute(
                    sa.select(
                        a.worker_id,
                        sa.func.count(),
                        sa.func.sum(sa.case((a.status == "running", 1), else_=0)),
                        sa.func.max(sa.func.coalesce(a.heartbeat_at, a.started_at)),
                    ).group_by(a.worker_id)
                )
            ]
            return StoreHealth(
                rollouts=by_status,
                attempts=attempt_counts,
                expired_leases=expired,
                failures=failures,
                retried_rollouts=retried,
                retries=int(retries),
                runners=sorted(runners, key=lambda x: -x.last_seen),
            )

        return await self._run(tx, write=False)
