"""Runs, metrics, searches and health for :class:`~agentbolt.store.memory.MemoryStore`."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Mapping

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

__all__ = ["MemoryRunsMixin"]


class MemoryRunsMixin:
    """Mixed into ``MemoryStore``; uses its lock, clock, rollouts and attempts."""

    _lock: threading.Lock
    _clock: Callable[[], float]
    _rollouts: dict[str, t.Rollout]
    _attempts: dict[str, t.Attempt]
    _runs: dict[str, Run]
    _run_metrics: dict[str, list[RunMetrics]]

    def _check_open(self) -> None: ...

    def _run_of(self, run_id: str) -> Run:
        try:
            return self._runs[run_id]
        except KeyError:
            raise NotFoundError("run", run_id) from None

    async def _start_run(self, spec: RunSpec) -> Run:
        with self._lock:
            self._check_open()
            run = run_common.new_run(spec, self._clock())
            if run.run_id in self._runs:
                raise ConflictError(f"run {run.run_id} already exists; use a new run_id")
            self._runs[run.run_id] = run
            self._run_metrics[run.run_id] = []
            return run

    async def _finish_run(self, run_id: str, status: RunStatus, error: str | None) -> Run:
        with self._lock:
            self._check_open()
            run = run_common.finished_run(self._run_of(run_id), status, error, self._clock())
            self._runs[run_id] = run
            return run

    async def _get_run(self, run_id: str) -> Run:
        with self._lock:
            return self._run_of(run_id)

    async def _list_runs(self, limit: int) -> list[Run]:
        with self._lock:
            return list(reversed(self._runs.values()))[:limit]

    async def _add_run_metrics(self, run_id: str, step: int, values: Mapping[str, float]) -> RunMetrics:
        clean = dict(values)  # checked by RunStore.add_run_metrics
        with self._lock:
            self._check_open()
            run = self._run_of(run_id)
            rows = self._run_metrics[run_id]
            row = RunMetrics(run_id=run_id, seq=len(rows) + 1, step=int(step), time=self._clock(), values=clean)
            rows.append(row)
            self._runs[run_id] = run.model_copy(
                update={"steps": max(run.steps, row.step), "latest": {**run.latest, **clean}}
            )
            return row

    async def _get_run_metrics(self, run_id: str, after_seq: int | None) -> list[RunMetrics]:
        with self._lock:
            self._run_of(run_id)
            return [m for m in self._run_metrics[run_id] if after_seq is None or m.seq > after_seq]

    async def _search_rollouts(self, query: RolloutSearch) -> RolloutSearchPage:
        with self._lock:
            found = [r for r in reversed(self._rollouts.values()) if run_common.matches_search(query, r)]
        return RolloutSearchPage(items=found[query.offset : query.offset + query.limit], total=len(found))

    async def _store_health(self) -> StoreHealth:
        with self._lock:
            now = self._clock()
            rollouts = Counter(r.status for r in self._rollouts.values())
            attempts = Counter(a.status for a in self._attempts.values())
            failures = Counter(
                r.error.kind.value
                for r in self._rollouts.values()
                if r.error is not None and r.status in (t.RolloutStatus.FAILED, t.RolloutStatus.CANCELLED)
            )
            expired = sum(
                a.status is t.AttemptStatus.RUNNING and a.lease_expires_at is not None and a.lease_expires_at <= now
                for a in self._attempts.values()
            )
            retried = [r.attempt_count - 1 for r in self._rollouts.values() if r.attempt_count > 1]
            runners: dict[str, list[t.Attempt]] = {}
            for a in self._attempts.values():
                runners.setdefault(a.worker_id, []).append(a)
        seen = [
            RunnerSeen(
                worker_id=w,
                attempts=len(xs),
                running=sum(a.status is t.AttemptStatus.RUNNING for a in xs),
                last_seen=max(max(a.started_at, a.heartbeat_at or 0.0) for a in xs),
            )
            for w, xs in runners.items()
        ]
        return StoreHealth(
            rollouts={s: rollouts.get(s, 0) for s in t.RolloutStatus},
            attempts={s: attempts.get(s, 0) for s in t.AttemptStatus},
            expired_leases=expired,
            failures=dict(failures),
            retried_rollouts=len(retried),
            retries=sum(retried),
            runners=sorted(seen, key=lambda r: -r.last_seen),
        )
