"""``memory://``: an in-process store for tests and single-process experiments.

Nothing survives the process. Safe to share between threads and event loops of one process.
Each ``_<operation>`` method implements the operation declared on :class:`~agentbolt.store.Store`
(arguments validated, defaults applied).
"""

from __future__ import annotations

import asyncio
import heapq
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from .. import types as t
from ..errors import InvalidTransitionError, NotFoundError, StaleAttemptError, UserError
from ..reward_precedence import final_rank
from . import lifecycle
from .base import AttemptReport, Notifier, Store, check_span_batch, normalize_statuses
from .run_memory import MemoryRunsMixin
from .run_records import Run, RunMetrics
from .sweeper import Sweeper

__all__ = ["MemoryStore"]

R = TypeVar("R")


class MemoryStore(MemoryRunsMixin, Store):
    """The in-memory backend. Options: ``sweep_interval_s`` (default 1.0), ``clock``."""

    def __init__(
        self,
        url: str = "memory://",
        *,
        sweep_interval_s: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.url = url
        self._clock = clock
        self._lock = threading.Lock()
        self._notifier = Notifier()
        self._qseq = 0
        self._rollouts: dict[str, t.Rollout] = {}
        self._order: dict[str, int] = {}
        self._queues: dict[t.RolloutMode, list[tuple[int, str]]] = {m: [] for m in t.RolloutMode}
        self._attempts: dict[str, t.Attempt] = {}
        self._attempts_of: dict[str, list[str]] = {}
        self._running: set[str] = set()
        self._spans: dict[str, dict[str, t.Span]] = {}
        self._span_seq: dict[str, int] = {}
        self._resources: list[t.Resources] = []
        self._runs: dict[str, Run] = {}
        self._run_metrics: dict[str, list[RunMetrics]] = {}
        self._closed = False
        self._sweeper = Sweeper(self._sweep_now, sweep_interval_s, name="agentbolt-memory-sweeper")

    # -- helpers (call with the lock held) ----------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise UserError("this store is closed; open a new one with open_store()")

    def _rollout(self, rollout_id: str) -> t.Rollout:
        try:
            return self._rollouts[rollout_id]
        except KeyError:
            raise NotFoundError("rollout", rollout_id) from None

    def _push(self, rollout: t.Rollout) -> None:
        heapq.heappush(self._queues[rollout.mode], (self._order[rollout.rollout_id], rollout.rollout_id))

    def _apply(self, rollout: t.Rollout, attempt: t.Attempt | None) -> None:
        """Store new versions of a rollout and its attempt, keeping the indexes in step."""
        previous = self._rollouts.get(rollout.rollout_id)
        self._rollouts[rollout.rollout_id] = rollout
        if rollout.status is t.RolloutStatus.QUEUED and (
            previous is None or previous.status is not t.RolloutStatus.QUEUED
        ):
            self._push(rollout)
        if attempt is not None:
            self._attempts[attempt.attempt_id] = attempt
            if attempt.status is t.AttemptStatus.RUNNING:
                self._running.add(attempt.attempt_id)
            else:
                self._running.discard(attempt.attempt_id)

    def _expire_one(self, attempt_id: str, now: float) -> bool:
        attempt = self._attempts[attempt_id]
        changed = lifecycle.expire(self._rollouts[attempt.rollout_id], attempt, now)
        if changed is None:
            return False
        self._apply(*changed)
        return True

    def _sweep_now(self) -> int:
        with self._lock:
            if self._closed:
                return 0
            now = self._clock()
            ended = sum(self._expire_one(aid, now) for aid in list(self._running))
        if ended:
            self._notifier.notify()
        return ended

    # -- rollouts -----------------------------------------------------------------------------

    async def _enqueue(self, specs: Sequence[t.RolloutSpec]) -> list[t.Rollout]:
        with self._lock:
            self._check_open()
            now = self._clock()
            known = {r.version for r in self._resources}
            for spec in specs:
                if spec.resources_version is not None and spec.resources_version not in known:
                    raise NotFoundError("resources version", spec.resources_version)
            ids = [spec.rollout_id or t.new_id("ro-") for spec in specs]  # Store.enqueue names every spec
            result, planned = lifecycle.plan_enqueue(ids, specs, self._rollouts, now)
            for rid, rollout in planned.items():
                self._qseq += 1
                self._order[rid] = self._qseq
                self._attempts_of[rid] = []
                self._spans[rid] = {}
                self._span_seq[rid] = 0
                self._apply(rollout, None)
        if planned:
            self._notifier.notify()
        return result

    async def _dequeue(
        self,
        worker_id: str,
        limit: int,
        lease_s: float,
        mode: t.RolloutMode | None,
        wait_s: float,
        rollout_ids: list[str] | None,
    ) -> list[t.Claim]:
        wanted = None if rollout_ids is None else list(dict.fromkeys(rollout_ids))

        async def attempt() -> tuple[bool, list[t.Claim]]:
            claims = self._claim(worker_id, limit, lease_s, mode, wanted)
            return bool(claims), claims

        return await self._wait_until(attempt, wait_s)

    def _claim(
        self, worker_id: str, limit: int, lease_s: float, mode: t.RolloutMode | None, wanted: list[str] | None = None
    ) -> list[t.Claim]:
        with self._lock:
            self._check_open()
            now = self._clock()
            latest = self._resources[-1].version if self._resources else None
            claims: list[t.Claim] = []
            if wanted is not None:  # these rollouts only, oldest first; their heap entries go stale
                chosen = [
                    self._rollouts[rid]
                    for rid in wanted
                    if rid in self._rollouts
                    and self._rollouts[rid].status is t.RolloutStatus.QUEUED
                    and (mode is None or self._rollouts[rid].mode is mode)
                ]
                chosen.sort(key=lambda r: self._order[r.rollout_id])
                for rollout in chosen[:limit]:
                    claims.append(self._claim_one(rollout, worker_id, lease_s, now, latest))
                return claims
            queues = [self._queues[mode]] if mode is not None else list(self._queues.values())
            while len(claims) < limit:
                candidates = [q for q in queues if q]
                if not candidates:
                    break
                queue = min(candidates, key=lambda q: q[0][0])
                _, rid = heapq.heappop(queue)
                queued = self._rollouts.get(rid)
                if queued is None or queued.status is not t.RolloutStatus.QUEUED:
                    continue  # stale heap entry (cancelled, purged or claimed by id)
                claims.append(self._claim_one(queued, worker_id, lease_s, now, latest))
            return claims

    def _claim_one(self, rollout: t.Rollout, worker_id: str, lease_s: float, now: float, latest: int | None) -> t.Claim:
        updated, attempt = lifecycle.claim(
            rollout,
            attempt_id=t.new_id("at-"),
            worker_id=worker_id,
            lease_s=lease_s,
            now=now,
            resources_version=latest,
        )
        self._apply(updated, attempt)
        self._attempts_of[rollout.rollout_id].append(attempt.attempt_id)
        return t.Claim(rollout=updated, attempt=attempt)

    async def _heartbeat(self, attempt_ids: Sequence[str], lease_s: float) -> list[t.Attempt]:
        with self._lock:
            self._check_open()
            unknown = [a for a in attempt_ids if a not in self._attempts]
            if unknown:
                raise NotFoundError("attempt", unknown)
            now = self._clock()
            ended = False
            out = []
            for aid in attempt_ids:
                ended |= self._expire_one(aid, now)
                attempt = lifecycle.renew(self._attempts[aid], lease_s, now)
                self._attempts[aid] = attempt
                out.append(attempt)
        if ended:
            self._notifier.notify()
        return out

    async def _finish_attempt(
        self, attempt_id: str, status: t.AttemptStatus, reward: float | None, error: t.ErrorInfo | None
    ) -> t.Rollout:
        report = AttemptReport.model_construct(attempt_id=attempt_id, status=status, reward=reward, error=error)
        (rollout,) = self._finish([report], (), keep_expiry=True)
        return rollout

    async def _finish_attempts(self, reports: Sequence[AttemptReport], spans: Sequence[t.Span]) -> list[t.Rollout]:
        return self._finish(reports, spans, keep_expiry=False)

    def _finish(
        self, reports: Sequence[AttemptReport], spans: Sequence[t.Span], *, keep_expiry: bool
    ) -> list[t.Rollout]:
        """Store ``spans`` and apply ``reports``, all or nothing; with ``keep_expiry`` a report
        refused because its attempt's lease or deadline had passed still leaves it expired."""
        with self._lock:
            self._check_open()
            self._check_spans(spans)
            now = self._clock()
            rollouts: dict[str, t.Rollout] = {}
            attempts: dict[str, t.Attempt] = {}
            out = []
            for report in reports:
                aid = report.attempt_id
                attempt = attempts.get(aid) or self._attempts.get(aid)
                if attempt is None:
                    raise NotFoundError("attempt", aid)
                rollout = rollouts.get(attempt.rollout_id) or self._rollouts[attempt.rollout_id]
                expired = lifecycle.expire(rollout, attempt, now)
                if expired is not None:
                    rollout, attempt = expired
                try:
                    rollout, attempt = lifecycle.finish(
                        rollout, attempt, report.status, now=now, reward=report.reward, error=report.error
                    )
                except StaleAttemptError:
                    if keep_expiry and expired is not None:
                        self._apply(*expired)
                        self._notifier.notify()
                    raise
                rollouts[rollout.rollout_id], attempts[aid] = rollout, attempt
                out.append(rollout)
            self._store_spans(spans)
            for attempt in attempts.values():
                self._apply(rollouts[attempt.rollout_id], attempt)
        self._notifier.notify()
        return out

    async def _cancel(self, rollout_ids: Sequence[str], reason: str) -> list[t.Rollout]:
        with self._lock:
            self._check_open()
            now = self._clock()
            plans = []
            for rid in rollout_ids:
                rollout = self._rollout(rid)
                attempt = self._attempts.get(rollout.current_attempt_id or "")
                plans.append(lifecycle.cancel(rollout, attempt, now, reason))  # validates all first
            for rollout, attempt in plans:
                self._apply(rollout, attempt)
            out = [r for r, _ in plans]
        self._notifier.notify()
        return out

    async def _get_rollouts(self, rollout_ids: Sequence[str]) -> list[t.Rollout]:
        with self._lock:
            unknown = [r for r in rollout_ids if r not in self._rollouts]
            if unknown:
                raise NotFoundError("rollout", unknown)
            return [self._rollouts[r] for r in rollout_ids]

    async def _get_attempts(self, rollout_id: str) -> list[t.Attempt]:
        with self._lock:
            self._rollout(rollout_id)
            return [self._attempts[a] for a in self._attempts_of[rollout_id]]

    async def _query_rollouts(
        self,
        status: t.RolloutStatus | Sequence[t.RolloutStatus] | None,
        mode: t.RolloutMode | None,
        group_id: str | None,
        limit: int,
        cursor: str | None,
    ) -> t.Page[t.Rollout]:
        statuses = normalize_statuses(status)
        after = _parse_cursor(cursor)
        with self._lock:
            items: list[t.Rollout] = []
            last = None
            for rid, rollout in self._rollouts.items():
                q = self._order[rid]
                if q <= after:
                    continue
                if statuses is not None and rollout.status not in statuses:
                    continue
                if mode is not None and rollout.mode != mode:
                    continue
                if group_id is not None and rollout.group_id != group_id:
                    continue
                if len(items) == limit:
                    return t.Page(items=items, next_cursor=str(last))
                items.append(rollout)
                last = q
            return t.Page(items=items, next_cursor=None)

    async def _count_rollouts(self, group_id: str | None) -> dict[t.RolloutStatus, int]:
        with self._lock:
            counts = dict.fromkeys(t.RolloutStatus, 0)
            for rollout in self._rollouts.values():
                if group_id is None or rollout.group_id == group_id:
                    counts[rollout.status] += 1
            return counts

    async def _wait_for_rollouts(self, rollout_ids: Sequence[str], timeout: float | None) -> list[t.Rollout]:
        pending = list(dict.fromkeys(rollout_ids))

        async def check() -> tuple[bool, None]:
            nonlocal pending
            with self._lock:
                missing = [r for r in pending if r not in self._rollouts]
                if missing:
                    raise NotFoundError("rollout", missing)
                pending = [r for r in pending if not self._rollouts[r].status.is_final]
            return not pending, None

        await self._wait_until(check, timeout)
        return await self.get_rollouts(rollout_ids)

    async def _wait_until(self, check: Callable[[], Awaitable[tuple[bool, R]]], timeout: float | None) -> R:
        """Re-run ``check`` on every change until it reports done or ``timeout`` passes."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            fut = self._notifier.future()  # registered before checking: no change is missed
            done, value = await check()
            remaining = None if deadline is None else deadline - loop.time()
            if done or (remaining is not None and remaining <= 0):
                self._notifier.discard(fut)
                return value
            # Changes notify; the periodic wake-up only bounds a sweep that is due but not run.
            await self._notifier.wait(fut, 1.0 if remaining is None else min(remaining, 1.0))

    async def _purge(self, rollout_ids: Sequence[str] | None, older_than_s: float | None) -> int:
        with self._lock:
            now = self._clock()
            chosen: list[str] = []
            if rollout_ids is not None:
                for rid in rollout_ids:
                    rollout = self._rollout(rid)
                    if not rollout.status.is_final:
                        raise InvalidTransitionError(
                            f"rollout {rid} is {rollout.status.value}; cancel it before purging"
                        )
                chosen.extend(dict.fromkeys(rollout_ids))
            if older_than_s is not None:
                chosen.extend(
                    rid
                    for rid, r in self._rollouts.items()
                    if r.status.is_final
                    and r.ended_at is not None
                    and r.ended_at <= now - older_than_s
                    and rid not in chosen
                )
            for rid in chosen:
                del self._rollouts[rid]
                del self._order[rid]
                for aid in self._attempts_of.pop(rid):
                    self._attempts.pop(aid, None)
                    self._running.discard(aid)
                self._spans.pop(rid, None)
                self._span_seq.pop(rid, None)
            return len(chosen)

    # -- spans --------------------------------------------------------------------------------

    async def _add_spans(self, spans: Sequence[t.Span]) -> int:
        with self._lock:
            self._check_open()
            self._check_spans(spans)
            return self._store_spans(spans)

    def _check_spans(self, spans: Sequence[t.Span]) -> None:
        """``NotFoundError`` for spans of unknown rollouts or attempts (call with the lock held)."""
        rollout_ids = check_span_batch(spans)
        unknown = sorted({rid for rid in rollout_ids if rid not in self._rollouts})
        if unknown:
            raise NotFoundError("rollout", unknown)
        for span, rid in zip(spans, rollout_ids, strict=True):
            if span.attempt_id is not None and span.attempt_id not in self._attempts_of[rid]:
                raise NotFoundError(f"attempt of rollout {rid}", span.attempt_id)

    def _store_spans(self, spans: Sequence[t.Span]) -> int:
        """Store checked spans (with the lock held); returns how many were new. A final reward
        outranked by one the attempt holds is refused (:mod:`agentbolt.reward_precedence`)."""
        added = 0
        for span, rid in zip(spans, check_span_batch(spans), strict=True):
            stored = self._spans[rid]
            if span.span_id in stored:
                continue
            rank = final_rank(span.attributes)
            if rank and any(
                final_rank(s.attributes) > rank for s in stored.values() if s.attempt_id == span.attempt_id
            ):
                continue
            self._span_seq[rid] += 1
            stored[span.span_id] = span.model_copy(update={"seq": self._span_seq[rid]})
            added += 1
        return added

    async def _query_spans(
        self, rollout_ids: Sequence[str], latest_attempt_only: bool, after_seq: int | None
    ) -> dict[str, list[t.Span]]:
        with self._lock:
            unknown = [r for r in rollout_ids if r not in self._rollouts]
            if unknown:
                raise NotFoundError("rollout", unknown)
            out: dict[str, list[t.Span]] = {}
            for rid in rollout_ids:
                current = self._rollouts[rid].current_attempt_id
                out[rid] = [
                    s
                    for s in self._spans[rid].values()
                    if (after_seq is None or (s.seq or 0) > after_seq)
                    and (not latest_attempt_only or s.attempt_id is None or s.attempt_id == current)
                ]
            return out

    # -- resources ----------------------------------------------------------------------------

    async def _add_resources(self, resources: t.Resources) -> t.Resources:
        with self._lock:
            self._check_open()
            version = (self._resources[-1].version or 0) + 1 if self._resources else 1
            stored = resources.model_copy(update={"version": version, "created_at": self._clock()})
            self._resources.append(stored)
            return stored

    async def _get_resources(self, version: int | None) -> t.Resources | None:
        with self._lock:
            if version is None:
                return self._resources[-1] if self._resources else None
            if 1 <= version <= len(self._resources):
                return self._resources[version - 1]
            raise NotFoundError("resources version", version)

    # -- maintenance --------------------------------------------------------------------------

    async def _sweep(self) -> int:
        return self._sweep_now()

    async def close(self) -> None:
        self._sweeper.stop()
        with self._lock:
            self._closed = True


def _parse_cursor(cursor: str | None) -> int:
    if cursor is None:
        return 0
    try:
        return int(cursor)
    except ValueError:
        raise UserError(f"invalid cursor {cursor!r}; pass back a Page.next_cursor unchanged") from None
