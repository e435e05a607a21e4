"""The store protocol: every store operation, declared once, and helpers backends share.

Each method of :class:`Store` decorated with :func:`~agentbolt.store.operations.operation` is
the one declaration of a store operation: its signature, bounds and defaults, its docs and its
route. The Python method, the wire format, the HTTP client's method and the server's route are
derived from it (:mod:`agentbolt.store.operations`); a backend subclasses :class:`Store` and
implements each operation as ``async def _<name>(self, **arguments)``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Annotated, Any, Protocol, runtime_checkable

from pydantic import BaseModel, Field

from .. import types as t
from ..errors import SchemaError, UserError
from .lifecycle import check_purge_args, ended_as_reported
from .operations import WIRE_CONFIG, Operation, operation
from .run_protocol import RunStore
from .wire import DEFAULT_LEASE_S, AgeSeconds, LeaseSeconds, Limit, Version, WaitSeconds

__all__ = ["AttemptReport", "Notifier", "Store", "check_span_batch", "normalize_statuses"]


class AttemptReport(BaseModel):
    """A worker's report of the end of an attempt (:meth:`Store.finish_attempts`)."""

    model_config = WIRE_CONFIG

    attempt_id: str
    """The attempt."""
    status: t.AttemptStatus
    """``succeeded`` or ``failed``."""
    reward: float | None = None
    """The episode's final reward."""
    error: t.ErrorInfo | None = None
    """Why it failed; kind ``infrastructure`` requeues the rollout while attempts remain."""


def _with_ids(request: Any) -> Any:
    """Give specs without a ``rollout_id`` one before anything is sent or stored (a retried
    request is then idempotent)."""
    specs = request.specs
    if all(s.rollout_id for s in specs):
        return request
    named = [s if s.rollout_id else s.model_copy(update={"rollout_id": t.new_id("ro-")}) for s in specs]
    return request.model_copy(update={"specs": named})


def _check_spans(request: Any) -> None:
    check_span_batch(request.spans)


async def _finish_applied(store: Store, request: Any) -> t.Rollout | None:
    rollouts = await _finishes_applied(store, [request])
    return rollouts[0] if rollouts else None


async def _finish_many_applied(store: Store, request: Any) -> list[t.Rollout] | None:
    return await _finishes_applied(store, request.reports)


async def _finishes_applied(store: Store, reports: Sequence[Any]) -> list[t.Rollout] | None:
    """The rollouts, if every report's attempt ended exactly as reported (a lost try applied)."""
    attempts = await store.heartbeat([r.attempt_id for r in reports])  # renews nothing: they ended
    if not all(ended_as_reported(a, r.status, r.error) for a, r in zip(attempts, reports, strict=True)):
        return None
    return await store.get_rollouts([a.rollout_id for a in attempts])


def _check_purge(request: Any) -> None:
    check_purge_args(request.rollout_ids, request.older_than_s)


def _all_final(rollouts: list[t.Rollout]) -> bool:
    return all(r.status.is_final for r in rollouts)


_CLAIMS_LOST = (
    "rollouts the lost try claimed, if any, return to the queue when their leases expire (nobody renews them)"
)


@runtime_checkable
class Store(RunStore, Protocol):
    """Durable home of rollouts, attempts, spans and resources. All methods are coroutines.

    Open one with :func:`agentbolt.store.open_store`. Runs and the dashboard's queries are in
    :class:`~agentbolt.store.run_protocol.RunStore`. Every backend passes the conformance
    suite in :mod:`agentbolt.testing.store_conformance`; see :mod:`agentbolt.store.lifecycle`
    for the status rules they share. Arguments are validated before a backend sees them: a
    bad value raises :class:`~agentbolt.errors.UserError` naming it, and nothing changes.
    """

    url: str
    """The URL the store was opened with (credentials removed)."""

    # -- rollouts -----------------------------------------------------------------------------

    @operation("POST /v1/rollouts", tag="rollouts", returns="rollouts", prepare=_with_ids)
    async def enqueue(self, specs: Sequence[t.RolloutSpec]) -> list[t.Rollout]:
        """Queue rollouts in one call, in order; returns them in the order given.

        Idempotent on caller-supplied ids: a spec whose id exists with the same content returns
        the stored rollout unchanged. Raises :class:`~agentbolt.errors.ConflictError` when an id
        exists with different content and :class:`~agentbolt.errors.NotFoundError` for an
        unknown ``resources_version``; nothing is written then.

        Args:
            specs: rollouts to queue, in order; a spec without ``rollout_id`` gets a new one.
        """
        ...

    @operation(
        "POST /v1/rollouts/dequeue",
        tag="attempts",
        returns="claims",
        waits="wait_s",
        done=bool,
        lost_answer=_CLAIMS_LOST,
    )
    async def dequeue(
        self,
        worker_id: str,
        *,
        limit: Limit = 1,
        lease_s: LeaseSeconds = DEFAULT_LEASE_S,
        mode: t.RolloutMode | None = None,
        wait_s: WaitSeconds = 0.0,
        rollout_ids: Annotated[list[str], Field(max_length=500)] | None = None,
    ) -> list[t.Claim]:
        """Claim up to ``limit`` queued rollouts (oldest first) under a lease of ``lease_s``.

        Each claim starts a new attempt. Two workers never receive the same rollout. When
        nothing is queued, waits up to ``wait_s`` seconds for work (woken by enqueues and
        requeues, not by polling in a loop), then returns an empty list. ``rollout_ids`` claims
        only among those rollouts (unknown or unqueued ids are skipped): how a caller that
        enqueued a rollout for itself (``agentbolt serve``'s sessions) claims exactly it.

        Args:
            worker_id: who claims; recorded on each attempt.
            limit: claim at most this many.
            lease_s: lease length in seconds; heartbeats renew it.
            mode: only ``train`` or only ``val`` rollouts.
            wait_s: seconds to wait for work when none is queued (a server caps each request).
            rollout_ids: claim only among these rollouts (at most 500).
        """
        ...

    @operation("POST /v1/attempts/heartbeat", tag="attempts", returns="attempts")
    async def heartbeat(
        self, attempt_ids: Sequence[str], *, lease_s: LeaseSeconds = DEFAULT_LEASE_S
    ) -> list[t.Attempt]:
        """Renew the leases of running attempts; returns every attempt's current state.

        An attempt that timed out, was lost or was cancelled comes back with that status: its
        worker must stop the agent. Unknown ids raise :class:`~agentbolt.errors.NotFoundError`.

        Args:
            attempt_ids: attempts to renew; every one's state is returned.
            lease_s: new lease length from now, in seconds.
        """
        ...

    @operation("POST /v1/attempts/finish", tag="attempts", returns="rollout", recover=_finish_applied)
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

        Args:
            attempt_id: the attempt.
            status: ``succeeded`` or ``failed``.
            reward: the episode's final reward.
            error: why it failed; kind ``infrastructure`` requeues the rollout while attempts remain.
        """
        ...

    @operation(
        "POST /v1/attempts/finish-batch",
        tag="attempts",
        returns="rollouts",
        prepare=_check_spans,
        recover=_finish_many_applied,
    )
    async def finish_attempts(
        self, reports: Sequence[AttemptReport], *, spans: Sequence[t.Span] = ()
    ) -> list[t.Rollout]:
        """Store spans and report the ends of attempts in one transaction; returns each
        report's rollout, in order.

        All or nothing: a report :meth:`finish_attempt` would refuse raises the same error, and
        nothing is written then, spans included. A worker sends an attempt's last spans with its
        end this way, so its rollout is never final without them, and one transaction serves the
        attempts that end together.

        Args:
            reports: the ends of attempts, each as :meth:`finish_attempt` takes it.
            spans: spans to store first (as :meth:`add_spans` does), of any rollouts.
        """
        ...

    @operation("POST /v1/rollouts/cancel", tag="rollouts", returns="rollouts")
    async def cancel(self, rollout_ids: Sequence[str], *, reason: str = "cancelled by caller") -> list[t.Rollout]:
        """Cancel unfinished rollouts; their running attempts fail with kind ``cancelled``.

        Args:
            rollout_ids: rollouts to cancel.
            reason: recorded as the rollouts' error message.
        """
        ...

    @operation("POST /v1/rollouts/get", tag="rollouts", returns="rollouts")
    async def get_rollouts(self, rollout_ids: Sequence[str]) -> list[t.Rollout]:
        """The rollouts, in the order given; unknown ids raise ``NotFoundError``.

        Args:
            rollout_ids: ids, answered in this order.
        """
        ...

    @operation("GET /v1/rollouts/{rollout_id:path}/attempts", tag="attempts", returns="attempts")
    async def get_attempts(self, rollout_id: str) -> list[t.Attempt]:
        """The attempts of a rollout, oldest first.

        Args:
            rollout_id: the rollout.
        """
        ...

    @operation("GET /v1/rollouts", tag="rollouts")
    async def query_rollouts(
        self,
        *,
        status: t.RolloutStatus | Sequence[t.RolloutStatus] | None = None,
        mode: t.RolloutMode | None = None,
        group_id: str | None = None,
        limit: Limit = 100,
        cursor: str | None = None,
    ) -> t.Page[t.Rollout]:
        """Rollouts matching every given filter, in enqueue order, one page at a time.

        Args:
            status: any of these statuses.
            mode: only this mode.
            group_id: only this group.
            limit: page size.
            cursor: ``next_cursor`` of the previous page.
        """
        ...

    @operation("GET /v1/rollouts/counts", tag="rollouts", returns="counts")
    async def count_rollouts(self, *, group_id: str | None = None) -> dict[t.RolloutStatus, int]:
        """How many rollouts are in each status (optionally within one group).

        Args:
            group_id: only this group.
        """
        ...

    @operation(
        "POST /v1/rollouts/wait",
        tag="rollouts",
        returns="rollouts",
        waits="timeout",
        done=_all_final,
        reports_done=True,
    )
    async def wait_for_rollouts(
        self, rollout_ids: Sequence[str], timeout: WaitSeconds | None = None
    ) -> list[t.Rollout]:
        """Wait until every rollout is final or ``timeout`` seconds pass; returns their states.

        Waits on notifications, not by polling the database in a loop.

        Args:
            rollout_ids: rollouts to wait for; their states are returned in this order.
            timeout: seconds to wait (``None``: until they are final; a server caps each request).
        """
        ...

    @operation("POST /v1/rollouts/purge", tag="rollouts", returns="purged", idempotent=False, prepare=_check_purge)
    async def purge(self, *, rollout_ids: Sequence[str] | None = None, older_than_s: AgeSeconds | None = None) -> int:
        """Delete finished rollouts with their attempts and spans; returns how many.

        ``rollout_ids`` selects by id (an unfinished one raises ``InvalidTransitionError``);
        ``older_than_s`` selects rollouts that ended at least that long ago.

        Args:
            rollout_ids: delete these (each must be finished).
            older_than_s: delete rollouts that ended at least this many seconds ago.
        """
        ...

    # -- spans --------------------------------------------------------------------------------

    @operation("POST /v1/spans", tag="spans", returns="added", prepare=_check_spans)
    async def add_spans(self, spans: Sequence[t.Span]) -> int:
        """Store spans in one transaction, assigning each rollout's next ``seq`` values.

        Idempotent on (rollout id, span id): a span stored before is skipped. Returns how many
        were new. Spans without a rollout id raise :class:`~agentbolt.errors.SchemaError`;
        unknown rollouts or attempts raise ``NotFoundError``; nothing is written then.

        Args:
            spans: spans of any rollouts, each with its ``rollout_id``.
        """
        ...

    @operation("POST /v1/spans/query", tag="spans", returns="spans")
    async def query_spans(
        self,
        rollout_ids: Sequence[str],
        *,
        latest_attempt_only: bool = False,
        after_seq: t.Int64 | None = None,
    ) -> dict[str, list[t.Span]]:
        """The spans of many rollouts in one call, each list in ``seq`` order.

        Args:
            rollout_ids: rollouts whose spans to return.
            latest_attempt_only: keep only the spans of each rollout's current attempt (and
                spans with no attempt id).
            after_seq: return only spans with a larger ``seq``.
        """
        ...

    # -- resources ----------------------------------------------------------------------------

    @operation("POST /v1/resources", tag="resources", returns="resources", body="resources", idempotent=False)
    async def add_resources(self, resources: t.Resources) -> t.Resources:
        """Store a resources snapshot under the next version; returns it with its version.

        Args:
            resources: the snapshot (its ``version`` and ``created_at`` are set by the store).
        """
        ...

    @operation("GET /v1/resources", tag="resources", returns="resources")
    async def get_resources(self, version: Version | None = None) -> t.Resources | None:
        """A version (``NotFoundError`` if unknown), or the latest (``None`` if none yet).

        Args:
            version: a version; the latest when omitted.
        """
        ...

    # -- maintenance --------------------------------------------------------------------------

    @operation("POST /v1/sweep", tag="maintenance", returns="ended")
    async def sweep(self) -> int:
        """Apply due deadlines and expired leases now; returns how many attempts ended.

        Backends also sweep in the background; call this to force it.
        """
        ...

    async def close(self) -> None:
        """Release connections and background work. The store is unusable afterwards."""
        ...

    async def _dispatch(self, op: Operation, request: BaseModel) -> Any:
        """Run an operation on this backend: ``await self._<name>(**arguments)``.

        ``request`` is validated; a backend reaching elsewhere (the HTTP client) overrides this.
        """
        handler = getattr(self, op.handler, None)
        if handler is None:
            raise NotImplementedError(
                f"{type(self).__name__} does not implement the store operation {op.name}: "
                f"define 'async def {op.handler}(self, {', '.join(op.parameters)})'"
            )
        return await handler(**request.__dict__)


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
    status: t.RolloutStatus | Sequence[t.RolloutStatus] | None,
) -> list[t.RolloutStatus] | None:
    """Status filter as a list (``None`` for no filter); validates the values."""
    if status is None:
        return None
    values = [status] if isinstance(status, str) else list(status)
    try:
        return [t.RolloutStatus(s) for s in values]
    except ValueError as exc:
        raise UserError(f"{exc}; valid statuses: {', '.join(s.value for s in t.RolloutStatus)}") from None
