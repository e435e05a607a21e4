"""A runner's writer: the spans of its attempts and their ends, in shared batches.

:class:`Reporter` is a :class:`~agentbolt.capture.tracing.SpanSink` that also takes the ends of
attempts (:meth:`Reporter.finish`). An end is written with every span queued before it, in one
:meth:`~agentbolt.store.Store.finish_attempts` call (one transaction), together with the other
attempts that ended meanwhile: a rollout is never final without its spans, and a runner running
many rollouts at once writes one transaction for a burst of ends instead of two per rollout.

When a batch is refused (say one attempt was cancelled under its agent: ``StaleAttemptError``),
its spans are written alone and each end is reported on its own, so the refusal reaches exactly
the attempt it concerns. While the store is unavailable the batch is retried, as spans are.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from .. import types as t
from ..capture.tracing import SpanSink
from ..errors import AgentboltError, StoreUnavailableError
from ..store.base import AttemptReport

__all__ = ["Reporter"]

log = logging.getLogger(__name__)


@dataclass
class _End:
    report: AttemptReport
    after: int
    """Spans queued before the end (written in its batch or an earlier one)."""
    result: asyncio.Future[t.Rollout] = field(
        repr=False, default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class Reporter(SpanSink):
    """Spans and attempt ends of one runner, written in batches (see the module docstring)."""

    def __init__(
        self, store: Any, *, batch_size: int = 500, interval_s: float = 0.05, max_queue: int = 200_000
    ) -> None:
        super().__init__(store, batch_size=batch_size, interval_s=interval_s, max_queue=max_queue)
        self._ends: list[_End] = []
        self.batches = 0
        """Batches of ends written (one transaction each)."""
        self.ends = 0
        """Attempt ends written in those batches."""

    async def finish(
        self,
        attempt_id: str,
        status: t.AttemptStatus,
        *,
        reward: float | None = None,
        error: t.ErrorInfo | None = None,
    ) -> t.Rollout:
        """Report the end of an attempt once every span queued before it is written, in the same
        transaction as the last of them; returns the rollout (errors as
        :meth:`~agentbolt.store.Store.finish_attempt` raises them)."""
        if self._wakeup is None or self._urgent is None:
            raise RuntimeError("Reporter.start() was not called")
        end = _End(AttemptReport(attempt_id=attempt_id, status=status, reward=reward, error=error), self._added)
        self._ends.append(end)
        self._urgent.set()  # someone waits: skip the batching delay
        self._wakeup.set()
        return await end.result

    async def close(self, timeout: float = 30.0) -> None:
        await super().close(timeout)
        for end in self._ends:  # the writer stopped: nobody will write these
            if not end.result.done():
                end.result.set_exception(StoreUnavailableError("the runner stopped before this report was written"))
        self._ends.clear()

    def _awaited(self) -> bool:
        return bool(self._ends)

    async def _write(self, spans: list[t.Span], upto: int) -> int:
        due = [e for e in self._ends if e.after <= upto]
        if not due:
            return await super()._write(spans, upto)
        self._ends = [e for e in self._ends if e.after > upto]
        backoff = 0.5
        rollouts: list[t.Rollout] | None = None
        while rollouts is None:
            try:
                rollouts = await self.store.finish_attempts([e.report for e in due], spans=spans)
                continue
            except AgentboltError as exc:
                if not isinstance(exc, StoreUnavailableError):  # a refusal: find whose
                    return await self._one_by_one(spans, upto, due)
                failure: Exception = exc
            except Exception as exc:
                failure = exc
            self.errors += 1
            log.warning("reporting %d attempt ends failed (%s); retrying in %.1f s", len(due), failure, backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 10.0)
        self.batches += 1
        self.ends += len(due)
        for end, rollout in zip(due, rollouts, strict=True):
            if not end.result.done():
                end.result.set_result(rollout)
        return 0

    async def _one_by_one(self, spans: list[t.Span], upto: int, due: list[_End]) -> int:
        """A refused batch: its spans alone, then each end on its own with its own outcome."""
        dropped = await super()._write(spans, upto)
        for end in due:
            r = end.report
            try:
                rollout = await self.store.finish_attempt(r.attempt_id, r.status, reward=r.reward, error=r.error)
            except Exception as exc:
                if not end.result.done():
                    end.result.set_exception(exc)
            else:
                if not end.result.done():
                    end.result.set_result(rollout)
        return dropped
