"""Sessions: how live calls become rollouts in the store.

**The mapping.** A session is a conversation (or an agent run) of a live client, keyed as
:mod:`agentbolt.online.keys` says. In the store it is one rollout per *segment*:

- the rollout (id ``{run}:s:{key}:{segment}``, mode ``train``, ``run_id`` the serve run, one
  attempt, ``max_attempts=1``) is enqueued and claimed by the serve process itself
  (``dequeue(rollout_ids=[...])``) when the session's first call arrives; its ``input`` holds the
  session key and its question (``first_message``: the last user message of the first call, see
  :func:`.keys.prompt_text`), its ``metadata`` the key, its source, the task key and
  the prompt key (``agentbolt.session.*``);
- every call is one LLM-call span of that attempt, exactly as for a training rollout (exact
  token ids, logprobs, policy version);
- feedback and judge scores are reward spans of the same attempt (:mod:`.feedback`);
- the attempt stays ``running`` while calls keep coming (the serve process renews its lease)
  and ends ``succeeded`` once the session is idle for ``idle_s`` (or on ``POST
  /v1/sessions/close``); a later call with the same key opens the next segment, a new rollout.
  A serve process that is down longer than the lease finds the attempt ``lost`` (the rollout
  ``failed``, kind ``lost``): its calls and feedback are kept and trained like a closed
  session's.

A call without a session key is a session of its own, closed when its call ends. Every answer
carries ``X-Agentbolt-Session-Id``, so a client can send feedback for a session it never named.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from .. import semconv
from .. import types as t
from .._tasks import cancel_and_wait
from ..errors import AgentboltError, ConflictError, StaleAttemptError
from ..gateway.recorder import CallRecord
from ..gateway.routing import RoutedCall, RouteError
from ..store.base import Store
from ..store.run_records import RolloutSearch
from . import keys
from .inflight import InflightJournal
from .options import SessionOptions

__all__ = ["META_KEY", "FeedbackUse", "Session", "SessionBook", "response_id_of"]

log = logging.getLogger(__name__)

META_KEY = "agentbolt.session.id"
"""Rollout metadata naming the session key (marks a rollout as a session segment)."""
META_SEGMENT = "agentbolt.session.segment"
META_SOURCE = "agentbolt.session.source"
META_TASK = "agentbolt.session.task_key"
META_PROMPT = "agentbolt.session.prompt_key"
_FIRST_MESSAGE_CHARS = 2000
ABORTED = "aborted"
"""Error type of a session ended because the last stop cut one of its calls."""


def response_id_of(record: CallRecord) -> str | None:
    """The response id the client received for a recorded call (``None`` if it got none)."""
    rid = record.extra.get(semconv.GEN_AI_RESPONSE_ID)
    if rid is None and record.response is not None:
        rid = record.response.get("id")
    return str(rid) if rid else None


@dataclass(frozen=True)
class FeedbackUse:
    """The first use of a feedback id in the run (what a conflicting reuse is told)."""

    fingerprint: str
    session_id: str
    target: str
    """``session <key>`` or ``response <id>``."""
    at: float
    """Wall-clock time it was recorded."""

    def describe(self) -> str:
        when = datetime.fromtimestamp(self.at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return f"first used at {when} for {self.target} (session {self.session_id!r})"


@dataclass
class Session:
    """One segment of a session, as the serve process tracks it."""

    key: str
    rollout_id: str
    attempt_id: str
    segment: int
    auto: bool = False
    """A call without a session key: closed when its call ends."""
    task_key: str | None = None
    prompt_key: str | None = None
    closed: bool = False
    last_active: float = field(default_factory=time.monotonic)
    inflight: int = 0
    calls: int = 0
    ended_at: float | None = None
    """Wall-clock close time (``None`` while open)."""
    rewards: int = 0
    """Reward spans recorded on it (client feedback and judge scores)."""
    has_final: bool = False
    """It has a final reward (session feedback, ``final`` response feedback, or a judge score)."""
    judged: bool = False
    """Its final reward came from the judge."""
    idle: asyncio.Event | None = field(default=None, repr=False)
    """Set when its last in-flight call ends (created by a caller waiting for that)."""


class SessionBook:
    """Routes live calls to sessions (a :class:`~agentbolt.gateway.routing.CallRouter`), keeps their
    attempts alive, closes idle ones, and finds the session of a response id for feedback.

    Args:
        store: the durable store.
        run_id: the serve run the session rollouts belong to.
        options: when sessions close (``idle_s``), their attempts' lease (``lease_s``, renewed
            every third of it while open) and how long they are remembered (``retention_s``).
        worker_id: recorded on the session attempts.
        live_version: called for the resources version new sessions record.
        journal: where live calls' starts and ends are noted, so that a restart after a crash
            ends the sessions whose calls it cut as ``aborted`` (:mod:`.inflight`).
    """

    def __init__(
        self,
        store: Store,
        run_id: str,
        options: SessionOptions | None = None,
        *,
        worker_id: str = "agentbolt-serve",
        live_version: Any = None,
        journal: InflightJournal | None = None,
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.options = options if options is not None else SessionOptions()
        self.worker_id = worker_id
        self._live_version = live_version
        self.journal = journal
        self.current: dict[str, Session] = {}
        """Session key -> its latest segment."""
        self.by_rollout: dict[str, Session] = {}
        self.segments: dict[str, list[str]] = {}
        """Session key -> rollout ids of its segments, oldest first."""
        self.responses: dict[str, str] = {}
        """Response id -> rollout id of the segment that answered it."""
        self._open_locks: dict[str, asyncio.Lock] = {}
        self._task: asyncio.Task[None] | None = None
        self._closing: set[asyncio.Task[None]] = set()
        self._last_heartbeat = 0.0
        self.counters = {
            "sessions_opened": 0,
            "sessions_closed": 0,
            "sessions_lost": 0,
            "sessions_aborted": 0,
            "calls": 0,
        }
        """Run totals: rebuilt from the store on start (sessions within ``retention_s``), then kept."""
        self.feedback_uses: dict[str, FeedbackUse] = {}
        """Feedback id -> its first use in the run (rebuilt from the store's reward spans on restart;
        kept when sessions are forgotten, so a reused id is found as long as the process runs)."""
        self._feedback_locks = [asyncio.Lock() for _ in range(64)]

    # -- lifecycle ----------------------------------------------------------------------------------

    async def start(self) -> None:
        """Load the run's sessions from the store (restart) and start the keeper task."""
        await self._load()
        self._task = asyncio.get_running_loop().create_task(self._keep(), name="agentbolt-sessions")

    async def stop(self) -> None:
        """Stop the keeper; open sessions stay open in the store (a restart resumes them)."""
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        if self.journal is not None:
            self.journal.close()

    # -- CallRouter ---------------------------------------------------------------------------------

    async def route(self, headers: Mapping[str, str], body: Mapping[str, Any], api: str) -> RoutedCall:
        key, source = keys.session_key(headers, body)
        task = keys.task_key(headers, body)
        if key is None:
            session = await self._open(f"call-{t.new_id()}", "call", task, body, auto=True)
        else:
            current = self.current.get(key)
            if current is None or current.closed:
                session = await self._open(key, source, task, body)
            else:
                session = current
        session.inflight += 1
        session.last_active = time.monotonic()
        number = self.journal.started(session.rollout_id) if self.journal is not None else 0
        return RoutedCall(
            session.rollout_id, session.attempt_id, [(keys.SESSION_HEADER, session.key)], (session, number)
        )

    def finished(self, call: RoutedCall, record: CallRecord | None) -> None:
        session: Session
        session, number = call.context
        if self.journal is not None:
            self.journal.ended(number)
        session.inflight -= 1
        session.last_active = time.monotonic()
        if session.inflight == 0 and session.idle is not None:
            session.idle.set()
        if record is not None:
            session.calls += 1
            self.counters["calls"] += 1
            response_id = response_id_of(record)
            if response_id is not None:
                self.responses[response_id] = session.rollout_id
        if session.auto and session.inflight == 0:
            closing = asyncio.get_running_loop().create_task(self._close(session))
            self._closing.add(closing)  # the loop keeps tasks weakly: hold it until it is done
            closing.add_done_callback(self._closing.discard)

    # -- lookups for feedback -----------------------------------------------------------------------

    def feedback_lock(self, feedback_id: str) -> asyncio.Lock:
        """The lock serializing the check-then-write of one feedback id (one of a fixed pool)."""
        return self._feedback_locks[zlib.crc32(feedback_id.encode()) % len(self._feedback_locks)]

    def session_segments(self, key: str) -> list[Session]:
        """Every known segment of a session (empty when unknown)."""
        return [self.by_rollout[r] for r in self.segments.get(key, ()) if r in self.by_rollout]

    def of_response(self, response_id: str) -> Session | None:
        """The segment that answered ``response_id``, if known."""
        rollout_id = self.responses.get(response_id)
        return None if rollout_id is None else self.by_rollout.get(rollout_id)

    def open_sessions(self) -> list[Session]:
        return [s for s in self.current.values() if not s.closed]

    async def close(self, key: str) -> bool:
        """Close the session ``key`` now (its in-flight calls finish first); False if unknown."""
        session = self.current.get(key)
        if session is None:
            return False
        if not session.closed:
            while session.inflight > 0:
                session.idle = session.idle or asyncio.Event()
                session.idle.clear()
                await session.idle.wait()
            await self._close(session)
        return True

    # -- internals ----------------------------------------------------------------------------------

    async def _open(
        self, key: str, source: str, task: str | None, body: Mapping[str, Any], *, auto: bool = False
    ) -> Session:
        lock = self._open_locks.setdefault(key, asyncio.Lock())
        async with lock:
            current = self.current.get(key)
            if current is not None and not current.closed:
                return current
            segment = 0 if current is None else current.segment + 1
            text = keys.prompt_text(body)
            pkey = keys.prompt_key(text)
            version = self._live_version() if self._live_version is not None else None
            for _ in range(100):
                rollout_id = f"{self.run_id}:s:{keys.safe_id(key)}:{segment}"
                spec = t.RolloutSpec(
                    rollout_id=rollout_id,
                    task_id=task,
                    input={"session_id": key, "first_message": text[:_FIRST_MESSAGE_CHARS]},
                    mode=t.RolloutMode.TRAIN,
                    resources_version=version,
                    max_attempts=1,
                    metadata={
                        META_KEY: key,
                        META_SEGMENT: segment,
                        META_SOURCE: source,
                        META_TASK: task,
                        META_PROMPT: pkey,
                    },
                    run_id=self.run_id,
                )
                try:
                    await self.store.enqueue([spec])
                except ConflictError:  # a segment id left by an earlier process: take the next
                    segment += 1
                    continue
                except AgentboltError as exc:
                    raise RouteError(
                        503, f"cannot open the session in the store: {exc}", "agentbolt_store_error"
                    ) from None
                break
            else:
                raise RouteError(503, f"cannot open a new segment of session {key!r}", "agentbolt_store_error")
            try:
                claims = await self.store.dequeue(
                    self.worker_id, rollout_ids=[rollout_id], lease_s=self.options.lease_s
                )
            except AgentboltError as exc:  # refused; a later call opens the next segment
                raise RouteError(503, f"cannot open the session in the store: {exc}", "agentbolt_store_error") from None
            if not claims:
                raise RouteError(503, f"session {key!r} could not be claimed in the store", "agentbolt_store_error")
            session = Session(
                key=key,
                rollout_id=rollout_id,
                attempt_id=claims[0].attempt.attempt_id,
                segment=segment,
                auto=auto,
                task_key=task,
                prompt_key=pkey,
            )
            self._remember(session)
            self.counters["sessions_opened"] += 1
            return session

    def _remember(self, session: Session) -> None:
        self.current[session.key] = session
        self.by_rollout[session.rollout_id] = session
        self.segments.setdefault(session.key, []).append(session.rollout_id)

    async def _close(self, session: Session, *, lost: bool = False) -> None:
        if session.closed:
            return
        session.closed = True
        session.ended_at = time.time()
        lock = self._open_locks.get(session.key)
        if lock is not None and not lock.locked():
            del self._open_locks[session.key]
        if lost:
            self.counters["sessions_lost"] += 1
            return
        try:
            await self.store.finish_attempt(session.attempt_id, t.AttemptStatus.SUCCEEDED)
        except StaleAttemptError:  # the lease ran out meanwhile: the store already ended it
            self.counters["sessions_lost"] += 1
            return
        except Exception as exc:
            log.warning("closing session %s failed (%s); retrying later", session.key, exc)
            session.closed = False
            session.ended_at = None
            return
        self.counters["sessions_closed"] += 1

    def _forget(self, cutoff: float) -> None:
        """Drop sessions closed before ``cutoff`` from memory (the store keeps them)."""
        old = [s for s in self.by_rollout.values() if s.closed and s.ended_at is not None and s.ended_at < cutoff]
        if not old:
            return
        gone = {s.rollout_id for s in old}
        for session in old:
            del self.by_rollout[session.rollout_id]
            left = [r for r in self.segments.get(session.key, ()) if r not in gone]
            if left:
                self.segments[session.key] = left
            else:
                self.segments.pop(session.key, None)
            if self.current.get(session.key) is session:
                del self.current[session.key]
        self.responses = {k: v for k, v in self.responses.items() if v not in gone}

    async def _keep(self) -> None:
        tick = max(0.05, min(1.0, self.options.idle_s / 4))
        while True:
            await asyncio.sleep(tick)
            try:
                await self._tick()
            except Exception:
                log.exception("session keeper failed; retrying")

    async def _tick(self) -> None:
        now = time.monotonic()
        for session in list(self.current.values()):
            if not session.closed and session.inflight == 0 and now - session.last_active >= self.options.idle_s:
                await self._close(session)
        self._forget(time.time() - self.options.retention_s)
        if now - self._last_heartbeat >= self.options.lease_s / 3:
            self._last_heartbeat = now
            await self._heartbeat()

    async def _heartbeat(self) -> None:
        open_ = {s.attempt_id: s for s in self.open_sessions()}
        ids = list(open_)
        for i in range(0, len(ids), 500):
            for attempt in await self.store.heartbeat(ids[i : i + 500], lease_s=self.options.lease_s):
                if attempt.status is not t.AttemptStatus.RUNNING:
                    log.warning("session %s ended in the store (%s)", open_[attempt.attempt_id].key, attempt.status)
                    await self._close(open_[attempt.attempt_id], lost=True)

    async def _load(self) -> None:
        """Rebuild the in-memory view of the run's sessions (after a restart)."""
        cutoff = time.time() - self.options.retention_s
        found: list[t.Rollout] = []
        offset = 0
        while True:
            page = await self.store.search_rollouts(
                RolloutSearch(run_id=self.run_id, mode=t.RolloutMode.TRAIN, limit=1000, offset=offset)
            )
            items = [r for r in page.items if META_KEY in r.metadata]
            found += [r for r in items if r.created_at >= cutoff]
            offset += len(page.items)
            if not page.items or offset >= page.total or page.items[-1].created_at < cutoff:
                break
        found.sort(key=lambda r: (r.created_at, _segment(r.metadata)))
        for rollout in found:
            meta = rollout.metadata
            key = str(meta[META_KEY])
            attempt_id = rollout.current_attempt_id
            if attempt_id is None:  # enqueued, never claimed (the process stopped in between)
                continue
            session = Session(
                key=key,
                rollout_id=rollout.rollout_id,
                attempt_id=attempt_id,
                segment=_segment(meta),
                auto=meta.get(META_SOURCE) == "call",
                task_key=_text(meta.get(META_TASK)),
                prompt_key=_text(meta.get(META_PROMPT)),
                closed=rollout.status is not t.RolloutStatus.RUNNING,
                ended_at=rollout.ended_at,
            )
            self._remember(session)
        await self._index_responses([r.rollout_id for r in found if r.rollout_id in self.by_rollout])
        self._count_loaded([r for r in found if r.rollout_id in self.by_rollout])
        if any(not s.closed for s in self.current.values()):
            await self._heartbeat()
        cut = self.journal.cut() if self.journal is not None else set()
        for session in self.open_sessions():
            if session.rollout_id in cut:  # a call was cut when the previous process stopped
                await self._abort(session)
            elif session.auto:  # its one call ended with the previous process
                await self._close(session)
        resumed = sum(not s.closed for s in self.current.values())
        if found:
            log.info(
                "sessions: %d segments loaded (%d open, resumed; %d aborted: a call was cut by the last stop)",
                len(found),
                resumed,
                sum(1 for s in self.by_rollout.values() if s.rollout_id in cut),
            )
        if self.journal is not None:
            self.journal.open()

    def _count_loaded(self, rollouts: Sequence[t.Rollout]) -> None:
        """The run's counters from what the store holds (so they survive restarts)."""
        sessions = [self.by_rollout[r.rollout_id] for r in rollouts]
        self.counters["sessions_opened"] = len(sessions)
        self.counters["calls"] = sum(s.calls for s in sessions)
        errors = {r.rollout_id: r.error.type if r.error is not None else None for r in rollouts}
        aborted = sum(1 for s in sessions if s.closed and errors.get(s.rollout_id) == ABORTED)
        lost = sum(1 for r in rollouts if r.error is not None and r.error.kind is t.ErrorKind.LOST)
        self.counters["sessions_aborted"] = aborted
        self.counters["sessions_lost"] = lost
        self.counters["sessions_closed"] = sum(1 for s in sessions if s.closed) - aborted - lost

    async def _abort(self, session: Session) -> None:
        """End a session whose call the last stop cut: its attempt fails with error type ``aborted``
        (its complete calls and rewards are kept, and trained like a closed session's)."""
        error = t.ErrorInfo(
            kind=t.ErrorKind.INFRASTRUCTURE,
            type=ABORTED,
            message="a call of this session was cut when the serve process stopped (crash or kill); "
            "its complete calls and rewards are kept",
        )
        try:
            await self.store.finish_attempt(session.attempt_id, t.AttemptStatus.FAILED, error=error)
        except StaleAttemptError:  # the lease ran out meanwhile: the store already ended it
            self.counters["sessions_lost"] += 1
        else:
            self.counters["sessions_aborted"] += 1
        session.closed = True
        session.ended_at = time.time()

    async def _index_responses(self, rollout_ids: Sequence[str]) -> None:
        for i in range(0, len(rollout_ids), 200):
            spans = await self.store.query_spans(rollout_ids[i : i + 200])
            for rollout_id, items in spans.items():
                session = self.by_rollout[rollout_id]
                for span in items:
                    attrs = span.attributes
                    response_id = attrs.get(semconv.GEN_AI_RESPONSE_ID)
                    if response_id and semconv.TOKEN_SOURCE in attrs:
                        self.responses[str(response_id)] = rollout_id
                        session.calls += 1
                    elif attrs.get(semconv.SPAN_KIND_ATTR) == semconv.KIND_REWARD:
                        session.rewards += 1
                        source = attrs.get(semconv.FEEDBACK_SOURCE)
                        if attrs.get(semconv.REWARD_IS_FINAL) is True and not (session.has_final and source == "judge"):
                            session.has_final = True
                            session.judged = source == "judge"
                        self._remember_feedback(session, span)

    def _remember_feedback(self, session: Session, span: t.Span) -> None:
        """Index a stored client feedback's id (its first use) for the run-wide id check."""
        attrs = span.attributes
        feedback_id = attrs.get(semconv.FEEDBACK_ID)
        if not isinstance(feedback_id, str) or attrs.get(semconv.FEEDBACK_SOURCE) != "client":
            return
        if feedback_id in self.feedback_uses:
            return
        response = attrs.get(semconv.REWARD_TARGET_RESPONSE_ID)
        target = f"response {response!r}" if response else f"session {session.key!r}"
        self.feedback_uses[feedback_id] = FeedbackUse(
            str(attrs.get(semconv.FEEDBACK_FINGERPRINT, "")), session.key, target, span.start_time_ns / 1e9
        )


def _segment(metadata: Mapping[str, Any]) -> int:
    """A session rollout's segment number from its metadata (0 when absent)."""
    value = metadata.get(META_SEGMENT)
    return int(value) if isinstance(value, int | float | str) and value != "" else 0


def _text(value: Any) -> str | None:
    """``value`` when it is a string, else ``None``."""
    return value if isinstance(value, str) else None
