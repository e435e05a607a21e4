"""Spans and resources for :class:`~agentbolt.store.sql.SqlStore` (SQLite, PostgreSQL).

Span ingest is the store's hottest path: everything per span is prepared before the
transaction, which only assigns ``seq`` values (a per-rollout counter on PostgreSQL, the row id
on SQLite, whose single writer commits in id order) and inserts the rows. Resources are
versioned snapshots, one row each.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from .. import types as t
from ..errors import NotFoundError
from ..reward_precedence import final_rank
from .base import check_span_batch
from .sql_schema import _INSERT_SPAN, _INSERT_SPAN_WITH_ID, _chunks, _cursor, _marks, span_key
from .sql_schema import resources as resources_table

if TYPE_CHECKING:
    from .sql_schema import _Sql

__all__ = ["SqlSpansMixin"]

R = TypeVar("R")


class _SpanWrite(NamedTuple):
    """A prepared span batch (see ``SqlSpansMixin._span_write``)."""

    rollout_ids: list[str]
    """The rollouts the spans belong to, sorted."""
    insert: Callable[[Connection], int]
    """Inserts the spans in the given transaction (locking their rollouts on PostgreSQL);
    returns how many were new."""
    committed: Callable[[], None]
    """Call after the transaction committed."""


class SqlSpansMixin:
    """Mixed into ``SqlStore``; uses its transaction runner, clock and SQL text."""

    _q: _Sql
    _known_attempts: set[tuple[str, str]]
    """(rollout, attempt) pairs already found valid (attempts never change rollout)."""

    if TYPE_CHECKING:  # SqlStore's, for the type checker only

        def _run(self, fn: Callable[[Connection], R], *, write: bool = True) -> Awaitable[R]: ...

        def _now(self) -> float: ...

    # -- spans --------------------------------------------------------------------------------

    async def _add_spans(self, spans: Sequence[t.Span]) -> int:
        if not spans:
            return 0
        write = self._span_write(spans)
        added = await self._run(write.insert)
        write.committed()
        return added

    def _span_write(self, spans: Sequence[t.Span]) -> _SpanWrite:
        """A span batch prepared outside any transaction (JSON bodies, keys, SQL text), so the
        transaction only assigns seq values and inserts: :meth:`_SpanWrite.insert` runs in a
        transaction (this one's or another operation's), :meth:`_SpanWrite.committed` after it."""
        # Everything per span is prepared here, so the writer thread only assigns seq values.
        by_rollout: dict[str, list[tuple[int, str | None, str]]] = {}
        finals: dict[str, dict[int, int]] = {}
        """Rollout -> {position in its group: precedence rank} of the final rewards written."""
        attempts_seen: set[tuple[str, str]] = set()
        for span, rid in zip(spans, check_span_batch(spans), strict=True):
            aid = span.attempt_id
            group = by_rollout.setdefault(rid, [])
            if rank := final_rank(span.attributes):
                finals.setdefault(rid, {})[len(group)] = rank
            group.append((span_key(span.span_id), aid, t.span_body_json(span)))
            if aid is not None:
                attempts_seen.add((rid, aid))
        rids = sorted(by_rollout)
        unchecked = sorted(attempts_seen - self._known_attempts)
        in_rids = f"rollout_id IN ({_marks(len(rids))})"
        if self._q.pg:
            # A per-rollout counter, bumped under the rollout's row lock: concurrent transactions
            # may commit out of id order, so ids alone would let an ``after_seq`` reader miss spans.
            counts = " ".join(["WHEN ? THEN ?"] * len(rids))
            allocate = self._q(
                f"UPDATE {{rollouts}} SET span_seq = span_seq + CASE rollout_id {counts} END WHERE {in_rids} RETURNING rollout_id, id, span_seq"
            )
            allocate_params: tuple[Any, ...] = (*(x for rid in rids for x in (rid, len(by_rollout[rid]))), *rids)
        else:
            # SQLite runs one write transaction at a time, so the span's row id, assigned here
            # from MAX(id), already increases in commit order: it serves as seq, and no rollout
            # row is rewritten per batch.
            allocate = self._q(f"SELECT rollout_id, id FROM {{rollouts}} WHERE {in_rids}")
            allocate_params = tuple(rids)

        def insert(conn: Connection) -> int:
            cur = _cursor(conn)
            if self._q.pg:  # lock in id order so concurrent batches cannot deadlock
                cur.execute(
                    self._q(f"SELECT 1 FROM {{rollouts}} WHERE {in_rids} ORDER BY rollout_id FOR UPDATE"), tuple(rids)
                )
            cur.execute(allocate, allocate_params)
            found = cur.fetchall()
            missing = sorted(set(rids) - {row[0] for row in found})
            if missing:
                raise NotFoundError("rollout", missing)
            if unchecked:
                known = set()
                for chunk in _chunks([a for _, a in unchecked]):
                    cur.execute(
                        self._q(
                            f"SELECT rollout_id, attempt_id FROM {{attempts}} WHERE attempt_id IN ({_marks(len(chunk))})"
                        ),
                        tuple(chunk),
                    )
                    known.update(cur.fetchall())
                bad = [f"{r}/{a}" for r, a in unchecked if (r, a) not in known]
                if bad:
                    raise NotFoundError("attempt of rollout", bad)
            refused = self._outranked(cur, {row[0]: row[1] for row in found}, finals, by_rollout) if finals else set()
            rows: list[tuple[Any, ...]] = []
            if self._q.pg:
                for rid, rkey, last in found:
                    group = by_rollout[rid]
                    first = last - len(group) + 1
                    rows.extend(
                        (rkey, first + i, *prepared) for i, prepared in enumerate(group) if (rid, i) not in refused
                    )
                if rows:
                    cur.executemany(self._q(_INSERT_SPAN), rows)
            else:
                cur.execute(self._q("SELECT COALESCE(MAX(id), 0) FROM {spans}"))
                next_id = cur.fetchone()[0] + 1
                for rid, rkey in sorted(found):
                    for i, prepared in enumerate(by_rollout[rid]):
                        if (rid, i) in refused:
                            continue
                        rows.append((next_id, rkey, next_id, *prepared))
                        next_id += 1
                if rows:
                    cur.executemany(self._q(_INSERT_SPAN_WITH_ID), rows)
            if not rows:
                return 0
            return cur.rowcount if cur.rowcount is not None and cur.rowcount >= 0 else len(rows)

        def committed() -> None:
            if unchecked:  # attempts never change rollout; remember the pairs that checked out
                if len(self._known_attempts) > 100_000:
                    self._known_attempts.clear()
                self._known_attempts.update(unchecked)

        return _SpanWrite(rids, insert, committed)

    def _outranked(
        self,
        cur: Any,
        rkeys: dict[str, int],
        finals: dict[str, dict[int, int]],
        by_rollout: dict[str, list[tuple[int, str | None, str]]],
    ) -> set[tuple[str, int]]:
        """(rollout, position) of the batch's final rewards outranked by a final reward of the
        same attempt, stored or earlier in the batch (:mod:`agentbolt.reward_precedence`)."""
        refused: set[tuple[str, int]] = set()
        for rid, ranks in finals.items():
            best: dict[str | None, int] = {}
            cur.execute(
                self._q("SELECT attempt_id, body FROM {spans} WHERE rkey = ? AND body LIKE ?"),
                (rkeys[rid], "%agentbolt.reward.final%"),
            )
            for aid, body in cur.fetchall():
                attributes = orjson.loads(body).get("attributes") or {}
                best[aid] = max(best.get(aid, 0), final_rank(attributes))
            group = by_rollout[rid]
            for i in sorted(ranks):
                aid = group[i][1]
                if ranks[i] < best.get(aid, 0):
                    refused.add((rid, i))
                else:
                    best[aid] = ranks[i]
        return refused

    async def _query_spans(
        self, rollout_ids: Sequence[str], latest_attempt_only: bool, after_seq: int | None
    ) -> dict[str, list[t.Span]]:
        ids = list(rollout_ids)

        def tx(conn: Connection) -> dict[str, list[tuple[int, str | None, str]]]:
            cur = _cursor(conn)
            keys: dict[int, tuple[str, str | None]] = {}  # rollouts.id -> (rollout id, current attempt)
            for chunk in _chunks(sorted(set(ids))):
                cur.execute(
                    self._q(
                        f"SELECT id, rollout_id, current_attempt_id FROM {{rollouts}} WHERE rollout_id IN ({_marks(len(chunk))})"
                    ),
                    tuple(chunk),
                )
                keys.update((k, (rid, aid)) for k, rid, aid in cur.fetchall())
            found = {rid for rid, _ in keys.values()}
            missing = [r for r in ids if r not in found]
            if missing:
                raise NotFoundError("rollout", missing)
            raw: dict[str, list[tuple[int, str | None, str]]] = {r: [] for r in ids}
            for key_chunk in _chunks(sorted(keys)):
                sql = f"SELECT rkey, seq, attempt_id, body FROM {{spans}} WHERE rkey IN ({_marks(len(key_chunk))})"
                params: tuple[Any, ...] = tuple(key_chunk)
                if after_seq is not None:
                    sql += " AND seq > ?"
                    params += (after_seq,)
                cur.execute(self._q(sql + " ORDER BY rkey, seq"), params)
                for rkey, seq, aid, body in cur.fetchall():
                    rid, current = keys[rkey]
                    if latest_attempt_only and aid is not None and aid != current:
                        continue
                    raw[rid].append((seq, aid, body))
            return raw

        raw = await self._run(tx, write=False)
        return {
            rid: [
                t.Span.model_validate_json(body).model_copy(update={"seq": seq, "rollout_id": rid, "attempt_id": aid})
                for seq, aid, body in rows
            ]
            for rid, rows in raw.items()
        }

    # -- resources ----------------------------------------------------------------------------

    async def _add_resources(self, resources: t.Resources) -> t.Resources:
        def tx(conn: Connection) -> t.Resources:
            now = self._now()
            body = resources.model_dump_json(exclude={"version", "created_at"})
            version = conn.execute(
                resources_table.insert().values(body=body, created_at=now).returning(resources_table.c.version)
            ).scalar_one()
            return resources.model_copy(update={"version": version, "created_at": now})

        return await self._run(tx)

    async def _get_resources(self, version: int | None) -> t.Resources | None:
        def tx(conn: Connection) -> t.Resources | None:
            stmt = sa.select(resources_table)
            stmt = (
                stmt.where(resources_table.c.version == version)
                if version is not None
                else stmt.order_by(resources_table.c.version.desc()).limit(1)
            )
            row = conn.execute(stmt).first()
            if row is None:
                if version is not None:
                    raise NotFoundError("resources version", version)
                return None
            return t.Resources.model_validate_json(row.body).model_copy(
                update={"version": row.version, "created_at": row.created_at}
            )

        return await self._run(tx, write=False)
