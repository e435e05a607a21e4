"""The trace ingestor: OTLP spans in, traced rollouts of a named run out.

:class:`TraceIngestor` is what ``agentbolt ingest`` runs behind its OTLP/HTTP and OTLP/gRPC
receivers (:mod:`.receivers`). For each batch of decoded spans it

1. translates and retokenizes them (:class:`~.translation.SpanTranslation`);
2. groups them into rollouts (:class:`~.grouping.TraceGrouping`);
3. creates each new group's rollout (``run_id`` the run, ``max_attempts=1``, ``input``
   ``{"trace_id": ...}`` or ``{"session_id": ...}``, ``metadata`` :data:`META_SOURCE` =
   ``"trace"`` plus the key) and claims it for itself (one attempt, kept alive while the trace is
   open), then stores the spans in that attempt. The store is idempotent on span ids, so an
   exporter's retry stores nothing twice, and a batch that arrives before or after another
   lands in the same rollout;
4. completes groups (:meth:`TraceIngestor.complete_due`, run every second by :meth:`start`'s
   keeper): the attempt ends ``succeeded`` with the scorer's or judge's reward, if any.

The store is the state: a restarted ingest process (same store, same run) finds each group's
rollout by its derived id and resumes counting from its stored spans.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .. import semconv
from .. import types as t
from .._tasks import cancel_and_wait
from ..errors import InvalidTransitionError, NotFoundError, UserError
from ..reward_validation import reward_span_problem
from ..store.base import Store
from ..store.run_records import RolloutSearch, RunSpec
from .grouping import GroupState, TraceGrouping
from .metadata import META_GROUP, META_KEY, META_SOURCE, SOURCE_TRACE
from .rewards import Scorer, TracedRollout, TraceFeedback, reward_span, rewards_of, run_scorer
from .translation import SpanTranslation

__all__ = ["META_KEY", "META_SOURCE", "IngestOptions", "TraceIngestor", "UnknownTrace"]

log = logging.getLogger(__name__)

WORKER_ID = "agentbolt-ingest"
_RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_LEASE_S = 3600.0


class UnknownTrace(LookupError):
    """Feedback names a trace or session whose spans never arrived."""


@dataclass(frozen=True)
class IngestOptions:
    """How traces become rollouts."""

    group_by: str | None = None
    """``None``: one rollout per trace; else the span/resource attribute naming the session
    (``session.id``...): one rollout per session."""
    quiet_s: float = 10.0
    """A trace completes this long after its root span arrived with no new span since."""
    max_open_s: float = 600.0
    """A trace whose root span never arrives completes this long after its first span."""

    def __post_init__(self) -> None:
        if not self.quiet_s >= 0 or not self.max_open_s > 0:
            raise UserError("quiet_s must be >= 0 and max_open_s > 0")


class TraceIngestor:
    """Turns traced spans into rollouts of the run ``run_id`` (see the module docstring).

    Args:
        store: where rollouts go.
        run_id: the run's id (created on :meth:`start` if new, resumed if it exists).
        translation: adapters and tokenizer (default: every installed adapter, no tokenizer).
        options: grouping and completion.
        scorer: a scoring function called once per completed trace (source ``agent``).
        judge: an :class:`agentbolt.rewards.LLMJudge` scoring completed traces (source ``judge``).
        clock: monotonic seconds (tests pass a fake one).
    """

    def __init__(
        self,
        store: Store,
        run_id: str,
        *,
        translation: SpanTranslation | None = None,
        options: IngestOptions | None = None,
        scorer: Scorer | None = None,
        judge: Any = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not _RUN_NAME.fullmatch(run_id):
            raise UserError(f"run name {run_id!r}: use letters, digits, '.', '_' and '-' (it prefixes rollout ids)")
        self.store = store
        self.run_id = run_id
        self.translation = translation if translation is not None else SpanTranslation()
        self.options = options if options is not None else IngestOptions()
        self.grouping = TraceGrouping(run_id, self.options.group_by)
        self.scorer = scorer
        self.judge = judge
        self.clock = clock
        self.groups: dict[str, GroupState] = {}
        """Rollout id -> its state."""
        self.rejected = 0
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._last_heartbeat = 0.0
        self.on_change: Callable[[GroupState], None] | None = None
        """Called after a group changed (new spans, completed, rewarded): the CLI's status lines."""

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self, *, keeper: bool = True) -> None:
        """Create or resume the run; with ``keeper``, complete due traces every second."""
        try:
            await self.store.get_run(self.run_id)
        except NotFoundError:
            config = {
                "group_by": self.options.group_by,
                "quiet_s": self.options.quiet_s,
                "adapters": self.translation.adapters,
                "tokenizer": self.translation.retokenizer is not None,
            }
            await self.store.start_run(RunSpec(run_id=self.run_id, name=self.run_id, algorithm="ingest", config=config))
        else:
            await self._rebuild_trace_groups()
        if keeper:
            self._task = asyncio.get_running_loop().create_task(self._keep(), name="agentbolt-ingest")

    async def _rebuild_trace_groups(self) -> None:
        """Session grouping on a resumed run: which group each trace already stored joined, read
        from the store (the traced rollouts' metadata, the trace ids of their spans). Without it a
        resent span of a trace that named its session, itself naming none, would become a rollout
        of its own trace: stored twice."""
        if self.grouping.group_by is None:
            return
        sessions: dict[str, str] = {}
        """Rollout id -> session value."""
        traces: list[str] = []
        offset = 0
        while True:
            page = await self.store.search_rollouts(RolloutSearch(run_id=self.run_id, limit=1000, offset=offset))
            for rollout in page.items:
                meta = rollout.metadata
                if meta.get(META_SOURCE) != SOURCE_TRACE or not isinstance(key := meta.get(META_KEY), str):
                    continue
                if meta.get(META_GROUP) == "session":
                    sessions[rollout.rollout_id] = key
                elif meta.get(META_GROUP) == "trace":
                    traces.append(key)
            offset += len(page.items)
            if not page.items or offset >= page.total:
                break
        known = self.grouping.trace_group
        ids = sorted(sessions)
        for i in range(0, len(ids), 200):
            for rollout_id, spans in (await self.store.query_spans(ids[i : i + 200])).items():
                for span in spans:
                    if not _own_reward(span):
                        known.setdefault(span.trace_id, ("session", sessions[rollout_id]))
        for trace_id in traces:
            known.setdefault(trace_id, ("trace", trace_id))
        if known:
            log.info("run %s resumed: %d traces of %d sessions known", self.run_id, len(known), len(sessions))

    async def stop(self) -> None:
        """Stop the keeper; open traces stay open in the store (a restart resumes them). Spans
        still held for their trace's session name (memory only) are stored first, as rollouts of
        their own traces, as ``max_open_s`` would: a stopped process loses none of what it accepted."""
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        async with self._lock:
            for (kind, key), spans in self.grouping.release_held().items():
                await self._store(kind, key, spans, self.clock())

    async def _keep(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            try:
                await self.complete_due()
                await self._heartbeat()
            except Exception:
                log.exception("completing traces failed; retrying in a second")

    # -- spans --------------------------------------------------------------------------------

    async def ingest(self, spans: Sequence[t.Span]) -> list[str]:
        """Store a batch of decoded spans; returns one reason per span that was rejected (a
        reward span whose value is not a finite number within 1e15)."""
        rejected: list[str] = []
        kept: list[t.Span] = []
        for span in spans:
            why = reward_span_problem(span.name, span.attributes)
            if why is None:
                kept.append(span)
            else:
                rejected.append(why)
        async with self._lock:
            now = self.clock()
            fresh = [s for s in kept if not self._counted_retry(s)]  # a retry is not translated again
            translated = [self.translation.translate(s) for s in fresh]
            for (kind, key), group_spans in self.grouping.assign(translated, now).items():
                await self._store(kind, key, group_spans, now)
        self.rejected += len(rejected)
        return rejected

    def _counted_retry(self, span: t.Span) -> bool:
        """Whether the span was stored before in its trace's known group (then counted as a duplicate)."""
        group = (
            ("trace", span.trace_id) if self.grouping.group_by is None else self.grouping.trace_group.get(span.trace_id)
        )
        state = None if group is None else self.groups.get(self.grouping.rollout_id(*group))
        if state is None or span.span_id not in state.span_ids:
            return False
        state.duplicates += 1
        return True

    async def _store(self, kind: str, key: str, spans: list[t.Span], now: float) -> None:
        state = await self._group(kind, key, now)
        placed = [s.model_copy(update={"rollout_id": state.rollout_id, "attempt_id": state.attempt_id}) for s in spans]
        await self.store.add_spans(placed)
        changed = False
        for span in placed:
            changed = state.count(span, now) or changed
        if changed:
            self._changed(state)

    async def _group(self, kind: str, key: str, now: float) -> GroupState:
        """The group's state, its rollout created and claimed (or found in the store) if new."""
        rollout_id = self.grouping.rollout_id(kind, key)
        state = self.groups.get(rollout_id)
        if state is not None:
            return state
        state = GroupState(kind=kind, key=key, rollout_id=rollout_id)
        spec = t.RolloutSpec(
            rollout_id=rollout_id,
            run_id=self.run_id,
            input={f"{kind}_id": key},
            max_attempts=1,
            metadata={META_SOURCE: SOURCE_TRACE, META_GROUP: kind, META_KEY: key},
        )
        (rollout,) = await self.store.enqueue([spec])
        if rollout.status == t.RolloutStatus.QUEUED:
            claims = await self.store.dequeue(WORKER_ID, rollout_ids=[rollout_id], lease_s=_LEASE_S)
            if claims:
                state.attempt_id = claims[0].attempt.attempt_id
        if not state.attempt_id:  # created before (a restart, or another ingest process)
            await self._resume(state, rollout, now)
        self.groups[rollout_id] = state
        return state

    async def _resume(self, state: GroupState, rollout: t.Rollout, now: float) -> None:
        attempts = await self.store.get_attempts(rollout.rollout_id)
        if not attempts:
            raise UserError(f"rollout {rollout.rollout_id} exists but has no attempt: was it enqueued by someone else?")
        state.attempt_id = attempts[-1].attempt_id
        stored = (await self.store.query_spans([rollout.rollout_id])).get(rollout.rollout_id, [])
        for span in stored:
            if not _own_reward(span):  # rewards this ingestor wrote are not spans the agent sent
                state.count(span, now)
        state.duplicates = 0
        state.completed = rollout.status != t.RolloutStatus.RUNNING
        state.reward, state.reward_source = rewards_of(stored)

    def _changed(self, state: GroupState) -> None:
        if self.on_change is not None:
            try:
                self.on_change(state)
            except Exception:
                log.exception("status callback failed")

    # -- completion ---------------------------------------------------------------------------

    async def complete_due(self) -> list[GroupState]:
        """Complete every group that is due (see :mod:`.grouping`); returns them."""
        async with self._lock:
            now = self.clock()
            for (kind, key), spans in self.grouping.release_held(now - self.options.max_open_s).items():
                await self._store(kind, key, spans, now)
                state = self.groups[self.grouping.rollout_id(kind, key)]
                state.first_at = min(state.first_at, now - self.options.max_open_s)  # held that long already
            due = [
                s for s in self.groups.values() if s.complete_due(now, self.options.quiet_s, self.options.max_open_s)
            ]
        for state in due:
            await self._complete(state)
        return due

    async def complete_all(self) -> list[GroupState]:
        """Complete every open group now, whatever the quiet period (``agentbolt ingest`` on exit
        with ``--complete-on-exit``, and tests)."""
        async with self._lock:
            for (kind, key), spans in self.grouping.release_held().items():
                await self._store(kind, key, spans, self.clock())
            due = [s for s in self.groups.values() if not s.completed and s.span_ids]
        for state in due:
            await self._complete(state)
        return due

    async def _complete(self, state: GroupState) -> None:
        """Score and finish a due group. Marked completed only at the end: a failure (the store
        unavailable) leaves it due, and the keeper tries again (rewards are idempotent)."""
        if state.closing:
            return
        state.closing = True
        try:
            await self._score_and_finish(state)
        finally:
            state.closing = False

    async def _score_and_finish(self, state: GroupState) -> None:
        if not state.trace_ids <= state.rooted:
            state.completion_note = "no root span"
        spans = (await self.store.query_spans([state.rollout_id])).get(state.rollout_id, [])
        traced = TracedRollout(state.rollout_id, self.run_id, state.key, sorted(state.trace_ids), spans)
        reward: float | None = None
        rewards: list[t.Span] = []
        if self.scorer is not None:
            try:
                reward = await run_scorer(self.scorer, traced)
            except Exception as exc:  # the scorer raised, or its value was refused (RewardRefused)
                log.warning("scoring %s failed: %s; it gets no reward from the scorer", state.rollout_id, exc)
                state.completion_note = f"scorer failed: {exc}"[:300]
            if reward is not None:
                rewards.append(
                    reward_span(
                        state.rollout_id,
                        state.attempt_id,
                        reward_id=f"scorer:{state.rollout_id}",
                        reward=reward,
                        source="agent",
                    )
                )
        if self.judge is not None:
            score = await self.judge.score(traced.trajectory)
            if score is not None:
                rewards.append(
                    reward_span(
                        state.rollout_id,
                        state.attempt_id,
                        reward_id=f"judge:{state.rollout_id}",
                        reward=score.reward,
                        source="judge",
                        comment=score.reason,
                    )
                )
        if rewards:
            await self.store.add_spans(rewards)
        try:
            await self.store.finish_attempt(state.attempt_id, t.AttemptStatus.SUCCEEDED, reward=reward)
        except (InvalidTransitionError, NotFoundError) as exc:  # finished before, or lost: the spans are kept
            log.info("attempt of %s not finished here: %s", state.rollout_id, exc)
        stored = (await self.store.query_spans([state.rollout_id])).get(state.rollout_id, [])
        state.reward, state.reward_source = rewards_of(stored)
        state.completed = True
        self._changed(state)

    async def _heartbeat(self) -> None:
        now = self.clock()
        if now - self._last_heartbeat < _LEASE_S / 3:
            return
        self._last_heartbeat = now
        open_ids = [s.attempt_id for s in self.groups.values() if not s.completed and s.attempt_id]
        if open_ids:
            await self.store.heartbeat(open_ids, lease_s=_LEASE_S)

    # -- rewards ------------------------------------------------------------------------------

    async def feedback(self, feedback: TraceFeedback) -> GroupState:
        """Store a reward for a trace's (or session's) rollout, at any time; raises
        :class:`UnknownTrace` when no span of it ever arrived."""
        if feedback.trace_id is not None:
            kind, key = self.grouping.trace_group.get(feedback.trace_id, ("trace", feedback.trace_id))
        else:
            assert feedback.session_id is not None
            kind, key = "session", feedback.session_id
        rollout_id = self.grouping.rollout_id(kind, key)
        async with self._lock:
            state = self.groups.get(rollout_id)
            if state is None:
                try:
                    found = await self.store.get_rollouts([rollout_id])
                except NotFoundError:
                    found = []
                if not found:
                    what = f"trace {feedback.trace_id!r}" if feedback.trace_id else f"session {feedback.session_id!r}"
                    raise UnknownTrace(
                        f"unknown {what} in run {self.run_id!r}: no span of it arrived yet; send feedback "
                        "after the trace was exported (its id is the OpenTelemetry trace id, 32 hex digits)"
                    )
                state = await self._group(kind, key, self.clock())
        span = reward_span(
            state.rollout_id,
            state.attempt_id,
            reward_id=f"feedback:{feedback.feedback_id}",
            reward=feedback.reward,
            source="client",
            final=feedback.final,
            dimensions=feedback.dimensions,
            comment=feedback.comment,
            fingerprint=feedback.fingerprint(),
        )
        await self.store.add_spans([span])
        stored = (await self.store.query_spans([state.rollout_id])).get(state.rollout_id, [])
        state.reward, state.reward_source = rewards_of(stored)
        self._changed(state)
        return state

    # -- status -------------------------------------------------------------------------------

    def status(self) -> list[dict[str, Any]]:
        """One row per traced rollout: spans, LLM calls, retokenized/excluded, reward, state."""
        return [status_row(s) for s in self.groups.values()]


def _own_reward(span: t.Span) -> bool:
    reward_id = span.attributes.get(semconv.FEEDBACK_ID)
    return isinstance(reward_id, str) and reward_id.startswith(("feedback:", "scorer:", "judge:"))


def status_row(state: GroupState) -> dict[str, Any]:
    """A group's status as JSON-ready values (``GET /v1/traces/status``, the CLI's lines)."""
    return {
        "rollout_id": state.rollout_id,
        "group": state.kind,
        "key": state.key,
        "traces": len(state.trace_ids),
        "spans": len(state.span_ids),
        "duplicates": state.duplicates,
        "late": state.late,
        "llm_calls": state.llm_calls,
        "retokenized": state.retokenized,
        "excluded": dict(state.excluded),
        "tool_calls": state.tool_calls,
        "agents": sorted(state.agents),
        "state": "complete" if state.completed else "open",
        "note": state.completion_note,
        "reward": state.reward,
        "reward_source": state.reward_source,
    }
