"""Scoring the sessions nobody rated: a judge's reward after the feedback window.

A closed session with no final reward ``judge_after_s`` after it closed is judged: with
``mode="rubric"`` each on its own (absolute score), with ``mode="ranking"`` together with the
other pending sessions of its group (RULER-style relative scores; a group of one falls back to
the rubric). The score is stored as a final reward span with ``agentbolt.feedback.source =
judge`` and the feedback id ``judge:{rollout_id}``, so it is idempotent and survives restarts. A
client's rating beats the judge's score whatever order they arrive in: the judge re-checks the
session (in memory and in the store) before writing, and the store refuses a judge's final
reward on an attempt that holds a client's (:mod:`agentbolt.reward_precedence`), so a client
that rates while the judge is thinking still wins; a client rating that arrives after the
judge's score supersedes it unless the session was already trained. A judge that fails leaves the session unscored; it is tried again at later
sweeps, ``max_tries`` times in all.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections import defaultdict
from collections.abc import Sequence

from ..reward_precedence import RANKS, final_rank
from ..rewards.judge import JudgeScore, LLMJudge
from ..rewards.trajectory import trajectory_from_spans
from ..store.base import Store
from .feedback import reward_span
from .grouping import Grouping, group_ids
from .options import JudgeOptions
from .sessions import Session

__all__ = ["JudgeSweep"]

log = logging.getLogger(__name__)


class JudgeSweep:
    """Judges pending sessions (see the module docstring) as ``options`` say: its judge, the
    window (``after_s``), ``mode`` and ``max_tries``.

    Args:
        options: ``agentbolt serve``'s judge options.
        store: where the sessions' spans are and their rewards go.
        grouping: how ``ranking`` groups sessions (the updates' grouping).
        max_batch: most sessions judged in one sweep.
    """

    def __init__(
        self, options: JudgeOptions, store: Store, *, grouping: Grouping = "auto", max_batch: int = 64
    ) -> None:
        self.options = options
        self.judge: LLMJudge = options.judge
        self.store = store
        self.grouping = grouping
        self.max_batch = max_batch
        self.tries: dict[str, int] = {}
        self.scores: list[float] = []
        """Every reward the judge gave (for the dashboard's judge-score mean)."""
        self.judged = 0
        self.superseded = 0
        """Scores not written because the client rated the session first."""

    def pending(self, sessions: Sequence[Session], trained: set[str], now: float | None = None) -> list[Session]:
        """Closed, unrewarded, untrained sessions past the window, oldest first."""
        now = time.time() if now is None else now
        out = [
            s
            for s in sessions
            if s.closed
            and not s.has_final
            and s.calls > 0
            and s.rollout_id not in trained
            and s.ended_at is not None
            and now - s.ended_at >= self.options.after_s
            and self.tries.get(s.rollout_id, 0) < self.options.max_tries
        ]
        out.sort(key=lambda s: s.ended_at or 0.0)
        return out[: self.max_batch]

    async def _rated(self, rollout_ids: Sequence[str]) -> set[str]:
        """Of ``rollout_ids``, those whose attempt holds a client's final reward (the store's view)."""
        if not rollout_ids:
            return set()
        spans = await self.store.query_spans(rollout_ids, latest_attempt_only=True)
        return {rid for rid, items in spans.items() if any(final_rank(s.attributes) > RANKS["judge"] for s in items)}

    async def sweep(self, sessions: Sequence[Session], trained: set[str]) -> int:
        """Judge the pending sessions; returns how many got a score."""
        pending = self.pending(sessions, trained)
        if not pending:
            return 0
        spans = await self.store.query_spans([s.rollout_id for s in pending], latest_attempt_only=True)
        trajectories = {s.rollout_id: trajectory_from_spans(spans.get(s.rollout_id, []), s.rollout_id) for s in pending}
        results: dict[str, JudgeScore | None] = {}
        if self.options.mode == "ranking":
            groups: dict[str, list[Session]] = defaultdict(list)
            for session, group in zip(pending, group_ids(pending, self.grouping, prefix="judge"), strict=True):
                groups[group].append(session)
            for members in groups.values():
                scores = await self.judge.rank([trajectories[s.rollout_id] for s in members])
                results.update({s.rollout_id: score for s, score in zip(members, scores, strict=True)})
        else:
            for session in pending:
                results[session.rollout_id] = await self.judge.score(trajectories[session.rollout_id])
        scored = 0
        rated = await self._rated([s.rollout_id for s in pending if results.get(s.rollout_id) is not None])
        for session in pending:
            score = results.get(session.rollout_id)
            self.tries[session.rollout_id] = self.tries.get(session.rollout_id, 0) + 1
            if score is None:
                continue
            if session.rollout_id in rated or (session.has_final and not session.judged):
                self.superseded += 1  # the client rated it while the judge was thinking
                continue
            span = reward_span(
                session,
                feedback_id=f"judge:{session.rollout_id}",
                reward=score.reward,
                final=True,
                source="judge",
                comment=score.reason or None,
            )
            if not await self.store.add_spans([span]):  # refused: a client's rating came first
                self.superseded += 1
                continue
            session.has_final = True
            session.rewards += 1
            session.judged = True
            self.scores.append(score.reward)
            scored += 1
        self.judged += scored
        if scored:
            log.info("judge scored %d sessions (mean %.3f)", scored, statistics.fmean(self.scores[-scored:]))
        return scored
