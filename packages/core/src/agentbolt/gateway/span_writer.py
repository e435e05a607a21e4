"""The gateway's span buffer: LLM-call spans are built per call and written to the store in
batches from a background task.

Three ways in: :meth:`SpanWriter.record` queues a span and returns (the batch goes out after
``interval_s``); :meth:`SpanWriter.log` also appends it to the local call log
(:mod:`agentbolt.gateway.call_log`) first — one ``write``, after which a crash of the process
cannot lose it — and the segment is released once the batch is in the store; without a call
log, :meth:`SpanWriter.write` queues it and waits until it is in the store. The gateway makes an
answered call durable before the answer's last byte leaves with the second (or the third).
Waiting calls are written together (group commit): while one batch is in the store's
transaction the next calls queue up and go in the next batch, with no batching delay: a call
waits for the batch in progress, then its own (more only while over ``batch`` calls wait ahead
of it)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from .. import types as t
from .._tasks import cancel_and_wait
from ..errors import NotFoundError
from ..store.background_writes import background_writes
from ..store.base import Store
from .call_log import CallLog
from .recorder import CallRecord, Retokenizer, build_span

__all__ = ["SpanWriter"]

log = logging.getLogger(__name__)


class SpanWriter:
    """Buffers spans and writes them to ``store`` in batches of ``batch`` from a background task.

    A store that fails is retried with back-off; spans of rollouts purged meanwhile are dropped
    (counted), and so is the oldest span once ``max_buffered`` wait (logged as an error).
    """

    def __init__(
        self,
        store: Store,
        *,
        interval_s: float,
        batch: int,
        max_buffered: int,
        retokenize: Retokenizer | None,
        call_log: CallLog | None = None,
    ) -> None:
        self.store = store
        self.call_log = call_log
        self.interval_s = interval_s
        self.batch = batch
        self.max_buffered = max_buffered
        self.retokenize = retokenize
        self.buffered: list[t.Span] = []
        self.added = 0
        self.written = 0
        self.dropped = 0
        self.late = 0
        """Calls whose :meth:`write` gave up waiting (the store did not take the span in time)."""
        self._wakeup = asyncio.Event()
        self._urgent = asyncio.Event()
        self._written = asyncio.Event()
        self._waiters: list[tuple[int, asyncio.Future[bool]]] = []
        """(span number, future) of :meth:`write` calls, in span order."""
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._in_flight = 0
        """Spans at the head of :attr:`buffered` in the store write in progress."""

    def start(self) -> None:
        """Start the background writer on the running loop."""
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="agentbolt-gateway-spans")

    async def stop(self) -> None:
        """Write what is buffered, then stop the background writer."""
        self._closing = True
        await self.flush()
        if self._task is not None:
            await cancel_and_wait(self._task)

    async def write(self, record: CallRecord, span_id: str, *, timeout: float = 30.0) -> bool:
        """Build the span of one call, queue it, and wait until it is in the store (or dropped, see
        the class docstring). False when the store did not take it within ``timeout`` seconds (the
        span stays queued; counted in :attr:`late`) or it could not be built."""
        if not self.record(record, span_id):
            return False
        return await self._wait(self.added, timeout)

    async def _wait(self, number: int, timeout: float) -> bool:
        """Wait until the ``number``-th span is in the store (see :meth:`write`)."""
        if self.written + self.dropped >= number:
            return True
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()
        self._waiters.append((number, waiter))
        self._urgent.set()
        # A timer on the future itself, not wait_for(shield(...)): each of those layers costs the
        # call one more event-loop turn after the write, on every answer's path.
        timer = loop.call_later(timeout, _resolve, waiter, False)
        try:
            written = await waiter
        finally:
            timer.cancel()
        if not written:
            self.late += 1
            log.error("the store did not take a call's span within %.0f s; the answer goes out anyway", timeout)
        return written

    async def log(self, record: CallRecord, span_id: str, *, timeout: float = 30.0) -> bool:
        """Build the span of one call, append it to the call log and queue it for writing: the
        call is durable when this returns, without waiting for the store (and without an
        event-loop turn). If the log cannot be written (disk full), waits for the store like
        :meth:`write`. False if the span could not be built, or not stored in time then."""
        if self.call_log is None:
            raise RuntimeError("SpanWriter.log needs a call_log")
        span = self._build(record, span_id)
        if span is None:
            return False
        try:
            self.call_log.append(span, self.added + 1)
        except OSError as exc:
            log.error("could not append to the call log (%s): this call waits for the store instead", exc)
            self._queue(span)
            return await self._wait(self.added, timeout)
        self._queue(span)
        return True

    def record(self, record: CallRecord, span_id: str) -> bool:
        """Build the span of one call and queue it for writing; False if it could not be built."""
        span = self._build(record, span_id)
        if span is None:
            return False
        self._queue(span)
        return True

    def _build(self, record: CallRecord, span_id: str) -> t.Span | None:
        try:
            return build_span(record, span_id=span_id, retokenize=self.retokenize)
        except Exception:  # never let span building break the proxy
            log.exception("could not build the span of a call in rollout %s", record.rollout_id)
            return None

    def _queue(self, span: t.Span) -> None:
        if len(self.buffered) >= self.max_buffered:
            first = self.added - len(self.buffered) + 1  # the number of the oldest buffered span
            self.buffered.pop(0)
            if self._in_flight:  # it is in the write in progress: dropped only if that write fails
                self._in_flight -= 1
            else:
                self._drop(first, 1)
            log.error(
                "gateway span buffer full (%d): dropping the oldest span; is the store reachable?", self.max_buffered
            )
        self.buffered.append(span)
        self.added += 1
        self._wakeup.set()

    def _drop(self, first: int, count: int) -> None:
        """Count spans ``first`` .. ``first + count - 1`` as dropped from the full buffer; with a
        call log their entries stay on disk, for the next gateway started on it to store."""
        if count <= 0:
            return
        self.dropped += count
        if self.call_log is not None:
            self.call_log.keep(first, first + count - 1)

    def _settle(self) -> None:
        """Release the :meth:`write` calls whose spans are written (or dropped)."""
        done = self.written + self.dropped
        if self.call_log is not None:
            self.call_log.release(done)
        while self._waiters and self._waiters[0][0] <= done:
            _, waiter = self._waiters.pop(0)
            _resolve(waiter, True)

    async def flush(self, timeout: float | None = 60.0) -> None:
        """Wait until every span recorded so far is in the store."""
        target = self.added
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.written + self.dropped < target:
            self._wakeup.set()
            self._written.clear()
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError(f"{target - self.written} gateway spans not yet written to the store")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._written.wait(), None if remaining is None else min(remaining, 1.0))

    async def _loop(self) -> None:
        backoff = 0.5
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            if self.interval_s > 0 and not self._closing and not self._waiters:
                self._urgent.clear()  # batch for interval_s, unless a waiting call comes
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._urgent.wait(), self.interval_s)
            while self.buffered:
                batch = self.buffered[: self.batch]
                first = self.added - len(self.buffered) + 1
                self._in_flight = len(batch)
                try:
                    with background_writes():  # no answer waits on it: off the event loop if the store can
                        await self.store.add_spans(batch)
                except NotFoundError as exc:  # rollouts purged meanwhile: those spans have no home
                    log.warning("dropping %d gateway spans: %s", len(batch), exc)
                    self.dropped += len(batch)
                except Exception as exc:
                    log.warning("writing %d gateway spans failed (%s); retrying in %.1f s", len(batch), exc, backoff)
                    self._drop(first, len(batch) - self._in_flight)  # the ones a full buffer let go meanwhile
                    self._in_flight = 0
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 10.0)
                    continue
                else:
                    self.written += len(batch)
                    backoff = 0.5
                del self.buffered[: self._in_flight]  # less the ones a full buffer let go meanwhile
                self._in_flight = 0
                self._settle()
                self._written.set()
                await asyncio.sleep(0)  # small batches, a pause between: calls never wait long on a write


def _resolve(waiter: asyncio.Future[bool], written: bool) -> None:
    """Release a :meth:`SpanWriter.write` call (``written``: its span is in the store or dropped);
    the first resolution counts."""
    if not waiter.done():
        waiter.set_result(written)
