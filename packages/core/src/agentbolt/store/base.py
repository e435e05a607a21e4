"""The store protocol every backend implements, and helpers backends share."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable, Sequence
from typing import Protocol, runtime_checkable

from .. import types as t
from ..errors import SchemaError, UserError
from .run_protocol import RunStore

__all__ = ["Notifier", "Store", "check_span_batch", "normalize_statuses"]


@runtime_checkable
class Store(RunStore, Protocol):
    """Durable home of rollouts, attempts, spans and resources. All methods are coroutines.

    Open one with :func:`agentbolt.store.open_store`. Runs and the dashboard's queries are in
    :class:`~agentbolt.store.run_protocol.RunStore`. Every backend passes the conformance
    suite in :mod:`agentbolt.testing.store_conformance`; see :mod:`agentbolt.store.lifecycle`
    for the status rules they share.
    """

    url: str
    """The URL the store was opened with (credentials removed)."""

    # -- rollouts -----------------------------------------------------------------------------

    async def enqueue(self, specs: Sequence[t.RolloutSpec]) -> list[t.Rollout]:
        """Queue rollouts in one call, in order; returns them in the order given.

        Idempotent on caller-supplied ids: a spec whose id exists with the same content returns
        the stored rollout unchanged. Raises :class:`~agentbolt.errors.ConflictError` when an id
        exists with different content and :class:`~agentbolt.errors.NotFoundError` for an
        unknown ``resources_version``; nothing is written then.
        """
        ...

    async def dequeue(
        self,
        worker_id: str,
        *,
        limit: int = 1,
        lease_s: float = 30.0,
        mode: t.RolloutMode | None = None,
        wait_s: float = 0.0,
    ) -> list[t.Claim]:
        """Claim up to ``limit`` queued rollouts (oldest first) under a lease of ``lease_s``.

        Each claim starts a new attempt. Two workers never receive the same rollout. When
        nothing is queued, waits up to ``wait_s`` seconds for work (woken by enqueues and
        requeues, not by polling in a loop), then returns an empty list.
        """
        ...

    async def heartbeat(self, attempt_ids: Sequence[str], *, lease_s: float = 30.0) -> list[t.Attempt]:
        """Renew the leases of running attempts; returns every attempt's current state.

        An attempt that timed out, was lost or was cancelled comes back with that status: its
        worker must stop the agent. Unknown ids raise :class:`~agentbolt.errors.NotFoundError`.
        """
        ...

    async def finish_attempt(
        self,
        attempt_id: str,
        status: t.AttemptStatus,
        *,
        reward: float | None = None,
        error: t.ErrorInfo | None = None,
    ) -> t.Rollout:
        """Report the end of an attempt (``succeeded`` or ``failed``); returns the rollout.

        A failure of kind ``infrastructure`` requeues the rollout while attempts remain.
        A report from an attempt that is no longer running raises
        :class:`~agentbolt.errors.StaleAttemptError` and changes nothing.
        """
        ...

    async def cancel(self, rollout_ids: Sequence[str], *, reason: str = "cancelled by caller") -> list[t.Rollout]:
        """Cancel unfinished rollouts; their running attempts fail with kind ``cancelled``."""
        ...

    async def get_rollouts(self, rollout_ids: Sequence[str]) -> list[t.Rollout]:
        """The rollouts, in the order given; unknown ids raise ``NotFoundError``."""
        ...

    async def get_attempts(self, rollout_id: str) -> list[t.Attempt]:
        """The attempts of a rollout, oldest first."""
        ...

    async def query_rollouts(
        self,
        *,
        status: t.RolloutStatus | Iterable[t.RolloutStatus] | None = None,
        mode: t.RolloutMode | None = None,
        group_id: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> t.Page[t.Rollout]:
        """Rollouts matching every given filter, in enqueue order, one page at a time."""
        ...

    async def count_rollouts(self, *, group_id: str | None = None) -> dict[t.RolloutStatus, int]:
        """How many rollouts are in each status (optionally within one group)."""
        ...

    async def wait_for_rollouts(self, rollout_ids: Sequence[str], timeout: float | None = None) -> list[t.Rollout]:
        """Wait until every rollout is final or ``timeout`` seconds pass; returns their states.

        Waits on notifications, not by polling the database in a loop.
        """
        ...

    async def purge(self, *, rollout_ids: Sequence[str] | None = None, older_than_s: float | None = None) -> int:
        """Delete finished rollouts with their attempts and spans; returns how many.

        ``rollout_ids`` selects by id (an unfinished one raises ``InvalidTransitionError``);
        ``older_than_s`` selects rollouts that ended at least that long ago.
        """
        ...

    # -- spans --------------------------------------------------------------------------------

    async def add_spans(self, spans: Sequence[t.Span]) -> int:
        """Store spans in one transaction, assigning each rollout's next ``seq`` values.

        Idempotent on (rollout id, span id): a span stored before is skipped. Returns how many
        were new. Spans without a rollout id raise :class:`~agentbolt.errors.SchemaError`;
        unknown rollouts or attempts raise ``NotFoundError``; nothing is written then.
        """
        ...

    async def query_spans(
        self,
        rollout_ids: Sequence[str],
        *,
        latest_attempt_only: bool = False,
        after_seq: int | None = None,
    ) -> dict[str, list[t.Span]]:
        """The spans of many rollouts in one call, each list in ``seq`` order.

        ``latest_attempt_only`` keeps the spans of each rollout's current attempt (and spans
        with no attempt id); ``after_seq`` returns only spans with a larger ``seq``.
        """
        ...

    # -- resources ----------------------------------------------------------------------------

    async def add_resources(self, resources: t.Resources) -> t.Resources:
        """Store a resources snapshot under the next version; returns it with its version."""
        ...

    async def get_resources(self, version: int | None = None) -> t.Resources | None:
        """A version (``NotFoundError`` if unknown), or the latest (``None`` if none yet)."""
        ...

    # -- maintenance --------------------------------------------------------------------------

    async def sweep(self) -> int:
        """Apply due deadlines and expired leases now; returns how many attempts ended.

        Backends also sweep in the background; call this to force it.
        """
        ...

    async def close(self) -> None:
        """Release connections and background work. The store is unusable afterwards."""
        ...


class Notifier:
    """Wakes coroutines (on any event loop, from any thread) when rollouts change.

    Waiters register a future *before* checking state, so a change in between is not lost.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = set()

    def future(self) -> asyncio.Future[None]:
        """A future completed at the next :meth:`notify`."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        with self._lock:
            self._waiters.add((loop, fut))
        return fut

    def discard(self, fut: asyncio.Future[None]) -> None:
        """Forget a future that is no longer awaited."""
        with self._lock:
            self._waiters.discard((fut.get_loop(), fut))

    def notify(self) -> None:
        """Wake every registered waiter."""
        with self._lock:
            waiters, self._waiters = self._waiters, set()
        for loop, fut in waiters:
            try:
                loop.call_soon_threadsafe(_resolve, fut)
            except RuntimeError:  # loop closed
                pass

    async def wait(self, fut: asyncio.Future[None], timeout: float) -> None:
        """Wait for ``fut`` at most ``timeout`` seconds."""
        try:
            await asyncio.wait_for(fut, timeout=max(timeout, 0.0))
        except TimeoutError:
            pass
        finally:
            self.discard(fut)


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def check_span_batch(spans: Sequence[t.Span]) -> list[str]:
    """Reject spans no backend can store (no rollout id); each span's rollout id, in order."""
    rollout_ids: list[str] = []
    for span in spans:
        if not isinstance(span, t.Span):
            raise SchemaError(f"add_spans takes Span objects, got {type(span).__name__}")
        if not span.rollout_id:
            raise SchemaError(
                f"span {span.name!r} ({span.span_id}) has no rollout_id; set it (or run inside a "
                "rollout so the tracer sets it) before storing"
            )
        rollout_ids.append(span.rollout_id)
    return rollout_ids


def normalize_statuses(
    status: t.RolloutStatus | Iterable[t.RolloutStatus] | None,
) -> list[t.RolloutStatus] | None:
    """Status filter as a list (``None`` for no filter); validates the values."""
    if status is None:
        return None
    values = [status] if isinstance(status, str) else list(status)
    try:
        return [t.RolloutStatus(s) for s in values]
    except ValueError as exc:
        raise UserError(f"{exc}; valid statuses: {', '.join(s.value for s in t.RolloutStatus)}") from None
