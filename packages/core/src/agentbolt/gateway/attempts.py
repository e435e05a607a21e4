"""Which attempts the gateway serves: a cache of the store's answer, re-checked in the background."""

from __future__ import annotations

import asyncio
import logging
import time

from .. import types as t
from ..errors import NotFoundError
from ..store.base import Store

__all__ = ["AttemptCache"]

log = logging.getLogger(__name__)


class AttemptCache:
    """Knows which attempts are running, so that steady-state calls never wait on the store.

    The first call of an attempt waits for a lookup; later calls are served from the cache,
    which is refreshed in the background once ``ttl_s`` has passed (0: every call waits for a
    fresh check). Ended attempts stay known as ended.
    """

    def __init__(self, store: Store, ttl_s: float) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self._known: dict[str, tuple[str, float]] = {}  # attempt id -> (rollout id, trusted until; -1 = ended)
        self._lookups: dict[str, asyncio.Future[None]] = {}
        self._background: set[asyncio.Task[None]] = set()  # the loop holds tasks weakly: keep them alive

    async def check(self, rollout_id: str, attempt_id: str) -> tuple[int, str, str] | None:
        """None when calls of this attempt may go upstream, else (HTTP status, message, error type)."""
        now = time.monotonic()
        known = self._known.get(attempt_id)
        # the first call of an attempt (or every call with ttl_s=0) is checked before anything goes upstream
        if known is None or (self.ttl_s <= 0 and known[1] >= 0):
            await self._refresh(rollout_id, attempt_id)
            known = self._known.get(attempt_id)
        elif 0 <= known[1] < now and attempt_id not in self._lookups:
            # Known to be running a moment ago: serve this call, re-check in the background
            # (a call can still pass within one check interval after the attempt ended).
            task = asyncio.get_running_loop().create_task(self._refresh(rollout_id, attempt_id))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
        if known is None:
            return 404, f"unknown rollout {rollout_id} or attempt {attempt_id}", "agentbolt_unknown_attempt"
        if known[0] != rollout_id:
            return 404, f"attempt {attempt_id} does not belong to rollout {rollout_id}", "agentbolt_unknown_attempt"
        if known[1] < 0:
            return (
                409,
                f"attempt {attempt_id} of rollout {rollout_id} has ended (timed out, lost, cancelled or finished); "
                "its calls are no longer accepted",
                "agentbolt_attempt_ended",
            )
        return None

    async def _refresh(self, rollout_id: str, attempt_id: str) -> None:
        """Look the attempt up (one lookup at a time per attempt)."""
        pending = self._lookups.get(attempt_id)
        if pending is not None:
            await pending
            return
        pending = self._lookups[attempt_id] = asyncio.get_running_loop().create_future()
        try:
            await self._lookup(rollout_id, attempt_id)
        except Exception as exc:  # store hiccup: keep what we knew, retry on a later call
            log.warning("checking attempt %s failed: %s", attempt_id, exc)
        finally:
            self._lookups.pop(attempt_id, None)
            pending.set_result(None)

    async def _lookup(self, rollout_id: str, attempt_id: str) -> None:
        try:
            attempts = await self.store.get_attempts(rollout_id)
        except NotFoundError:
            return
        for attempt in attempts:
            if attempt.attempt_id == attempt_id:
                until = time.monotonic() + self.ttl_s if attempt.status is t.AttemptStatus.RUNNING else -1.0
                self._known[attempt_id] = (rollout_id, until)
                if len(self._known) > 100_000:  # bound the cache; ended attempts are re-checked
                    self._known = {k: v for k, v in self._known.items() if v[1] >= time.monotonic()}
                return
