"""What the Serving page shows about an ``agentbolt serve`` run, read from the store only.

``agentbolt serve`` records everything the page needs in the store (docs/online.md):

- **sessions** are rollouts of the serve run (mode ``train``, rollout metadata
  ``agentbolt.session.*``): their LLM-call spans are the calls, their reward spans the feedback
  (``agentbolt.feedback.source`` ``client`` or ``judge``); the attempt is ``running`` while the
  session is open;
- the run's **metrics** (``online/*``, ``judge/*``, ``serve/live_version``, written every
  ``metrics_every_s`` and at stop) give the all-time counters; every update writes one metrics row
  with its ``train/*`` numbers and the gate's decision (``gate/version``, ``gate/passed``,
  ``gate/candidate_mean``, ``gate/live_mean``, ``gate/delta``, ``gate/delta_se``, ``gate/bound``);
- the gate's **evaluation rollouts** (mode ``val``, ``step`` = the version evaluated, ids
  ``{run}:gate:v{version}:...``) say how many evaluation rollouts a candidate ran and how many failed;
- the run's **config** holds the gate's settings (``z``, ``tolerance``, ``max_failed``, task count),
  the judge's and whether the server trains.

So the page works on any store (SQLite, PostgreSQL, a store server) without the serve process's
state directory. The reason shown for a decision is rebuilt from those numbers with the gate's own
wording (:func:`agentbolt.online.gate.decide`); the ledger (``{state_dir}/ledger.jsonl``) and
``GET /v1/online/status`` hold the same text.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.errors import UserError
from agentbolt.online.gate import score_of
from agentbolt.online.sessions import META_KEY
from agentbolt.runs.views import span_kind
from agentbolt.store import RolloutSearch
from agentbolt.store.base import Store
from agentbolt.store.run_records import Run, RunMetrics

__all__ = [
    "SERVE_ALGORITHM",
    "DecisionRow",
    "FeedbackShares",
    "JudgeSummary",
    "ServingView",
    "SessionRow",
    "VersionRow",
    "serve_runs",
    "serving_view",
]

SERVE_ALGORITHM = "serve"
"""The ``algorithm`` of the runs ``agentbolt serve`` records."""
DEFAULT_SESSIONS = 50
MAX_SESSIONS = 500
MAX_DECISIONS = 50
"""Decisions whose evaluation rollouts are looked up (the newest)."""

_META_SEGMENT = "agentbolt.session.segment"
_META_TASK = "agentbolt.session.task_key"


@dataclass
class SessionRow:
    """One session segment (one rollout)."""

    session_id: str
    """The session key (``X-Agentbolt-Session-Id``, the client's conversation or trace id, or
    ``call-...`` for a call without one)."""
    segment: int
    rollout_id: str
    state: str
    """``open``, ``closed`` or ``lost`` (the serve process was down longer than its lease: kept
    and trained like a closed session)."""
    calls: int
    feedback: str
    """``rated`` (a client's final reward), ``judged`` (the judge's) or ``awaiting feedback``."""
    reward: float | None
    """The final reward (the latest one wins), ``None`` while awaiting feedback."""
    response_rewards: int
    """Rewards given to single responses (not the session's return)."""
    comment: str | None
    version: int | None
    """The live version when the session opened."""
    task_key: str | None
    opened_at: float
    last_active_at: float
    ended_at: float | None


@dataclass
class FeedbackShares:
    """How closed sessions got their final reward."""

    closed: int = 0
    rated: int = 0
    judged: int = 0
    unrated: int = 0
    open: int = 0

    def share(self, part: int) -> float | None:
        return part / self.closed if self.closed else None


@dataclass
class JudgeSummary:
    """The judge's scores and costs."""

    configured: bool | None
    """From the run's config (``None``: a serve run recorded before it said)."""
    settings: dict[str, Any] | None
    scored: int = 0
    """Judge scores among the sessions shown."""
    mean: float | None = None
    """Their mean reward."""
    mean_all: float | None = None
    """Mean of every score the running serve process gave (``online/judge_mean``)."""
    judged_all: int | None = None
    calls: int | None = None
    malformed: int | None = None
    """Answers that could not be parsed (asked again; never a crash)."""
    failed: int | None = None
    """Sessions the judge could not score after every try."""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


@dataclass
class DecisionRow:
    """One update's candidate and what the gate decided."""

    version: int
    time: float
    passed: bool
    reason: str
    candidate_mean: float | None = None
    candidate_se: float | None = None
    live_mean: float | None = None
    live_se: float | None = None
    delta: float | None = None
    delta_se: float | None = None
    bound: float | None = None
    sessions: int | None = None
    """Sessions the update trained on."""
    rows: int | None = None
    train_reward: float | None = None
    train_seconds: float | None = None
    eval_rollouts: int | None = None
    eval_failed: int | None = None

    @property
    def verdict(self) -> str:
        return "promoted" if self.passed else "kept out"


@dataclass
class VersionRow:
    """A policy version of the serve run."""

    version: int
    status: str
    """``live``, ``was live`` or ``kept out``."""
    since: float | None
    """When it went live (or was kept out)."""
    decision: DecisionRow | None = None
    """``None`` for the version the server started with."""


@dataclass
class ServingView:
    """Everything the Serving page shows (see the module docstring)."""

    run: Run
    trains: bool | None
    gate: dict[str, Any] | None
    live_version: int | None
    live_mean: float | None
    live_se: float | None
    last_heard: float | None
    """Latest metrics row or session activity (the server writes metrics every
    ``metrics_every_s``; a long silence means it is stopped)."""
    metrics_every_s: float | None
    counters: dict[str, float]
    """The latest ``online/*`` counters (as of the last metrics row)."""
    sessions_total: int
    sessions: list[SessionRow]
    shown: FeedbackShares
    """Shares among the sessions shown (read from the store now)."""
    overall: FeedbackShares | None
    """Shares among every session the serve process knows (its last metrics row)."""
    judge: JudgeSummary
    decisions: list[DecisionRow]
    """Newest first."""
    versions: list[VersionRow]
    """Newest first."""
    updates: dict[str, Any] = field(default_factory=dict)
    """The run's update settings (``min_sessions``, ``grouping``, ...)."""

    def as_json(self) -> dict[str, Any]:
        """The view as JSON-ready data (the ``/api/runs/{id}/serving`` answer)."""
        out = asdict(self)
        out["run"] = self.run.model_dump(mode="json")
        out["shown"]["shares"] = _shares(self.shown)
        if self.overall is not None:
            out["overall"]["shares"] = _shares(self.overall)
        for row, data in zip(self.decisions, out["decisions"], strict=True):
            data["verdict"] = row.verdict
        for version, data in zip(self.versions, out["versions"], strict=True):
            if version.decision is not None:
                data["decision"]["verdict"] = version.decision.verdict
        return out


def _shares(shares: FeedbackShares) -> dict[str, float | None]:
    return {k: shares.share(getattr(shares, k)) for k in ("rated", "judged", "unrated")}


async def serve_runs(store: Store, *, limit: int = 200) -> list[Run]:
    """The store's ``agentbolt serve`` runs, newest first."""
    return [r for r in await store.list_runs(limit=limit) if r.algorithm == SERVE_ALGORITHM]


async def serving_view(store: Store, run_id: str, *, sessions: int = DEFAULT_SESSIONS) -> ServingView:
    """The Serving page of the serve run ``run_id`` with its ``sessions`` newest sessions.

    Raises ``NotFoundError`` for an unknown run and ``UserError`` for a run that is not a serve run.
    """
    if not 1 <= sessions <= MAX_SESSIONS:
        raise UserError(f"sessions must be between 1 and {MAX_SESSIONS}, got {sessions}")
    run = await store.get_run(run_id)
    if run.algorithm != SERVE_ALGORITHM:
        raise UserError(
            f"run {run_id!r} is a {run.algorithm!r} run, not an `agentbolt serve` run: its page is /runs/{run_id}"
        )
    config: Mapping[str, Any] = run.config
    gate = config.get("gate") if isinstance(config.get("gate"), dict) else None
    judge_settings = config.get("judge") if isinstance(config.get("judge"), dict) else None
    history = await store.get_run_metrics(run_id)
    latest = run.latest

    page = await store.search_rollouts(RolloutSearch(run_id=run_id, mode=t.RolloutMode.TRAIN, limit=sessions))
    rollouts = [r for r in page.items if META_KEY in r.metadata]
    spans = await store.query_spans([r.rollout_id for r in rollouts]) if rollouts else {}
    rows = [_session_row(r, spans.get(r.rollout_id, [])) for r in rollouts]
    shown = FeedbackShares()
    for row in rows:
        if row.state == "open":
            shown.open += 1
            continue
        shown.closed += 1
        if row.feedback == "rated":
            shown.rated += 1
        elif row.feedback == "judged":
            shown.judged += 1
        else:
            shown.unrated += 1

    judge_scores = [r.reward for r in rows if r.feedback == "judged" and r.reward is not None]
    judge = JudgeSummary(
        configured=None if "judge" not in config else judge_settings is not None,
        settings=judge_settings,
        scored=len(judge_scores),
        mean=sum(judge_scores) / len(judge_scores) if judge_scores else None,
        mean_all=latest.get("online/judge_mean"),
        judged_all=_int(latest.get("online/judged")),
        calls=_int(latest.get("judge/calls")),
        malformed=_int(latest.get("judge/malformed")),
        failed=_int(latest.get("judge/failed")),
        prompt_tokens=_int(latest.get("judge/prompt_tokens")),
        completion_tokens=_int(latest.get("judge/completion_tokens")),
    )

    decisions = [_decision(m, gate) for m in history if "gate/version" in m.values]
    decisions.reverse()
    for decision in decisions[:MAX_DECISIONS]:
        await _count_evaluation(store, run_id, decision, gate)
    live_version = _int(latest.get("serve/live_version"))
    versions = _versions(run, history, decisions, live_version)
    live_mean, live_se = _live_score(history, decisions, live_version)
    last_activity = max((r.last_active_at for r in rows), default=None)
    last_heard = max((x for x in (history[-1].time if history else None, last_activity) if x is not None), default=None)
    every = config.get("metrics_every_s")
    updates = config.get("updates")
    return ServingView(
        run=run,
        trains=config["trains"] if isinstance(config.get("trains"), bool) else None,
        gate=gate,
        live_version=live_version,
        live_mean=live_mean,
        live_se=live_se,
        last_heard=last_heard,
        metrics_every_s=float(every) if isinstance(every, int | float) else None,
        counters={k: v for k, v in latest.items() if k.startswith(("online/", "serve/"))},
        sessions_total=page.total,
        sessions=rows,
        shown=shown,
        overall=_overall(latest),
        judge=judge,
        decisions=decisions,
        versions=versions,
        updates=dict(updates) if isinstance(updates, dict) else {},
    )


def _session_row(rollout: t.Rollout, spans: Sequence[t.Span]) -> SessionRow:
    meta = rollout.metadata
    calls = 0
    last = rollout.started_at or rollout.created_at
    final: t.Span | None = None
    response_rewards = 0
    for span in spans:
        kind = span_kind(span)
        if kind == semconv.KIND_LLM:
            calls += 1
            last = max(last, span.end_time_ns / 1e9 if span.end_time_ns else span.start_time_ns / 1e9)
        elif kind == semconv.KIND_REWARD:
            if span.attributes.get(semconv.REWARD_IS_FINAL) is True:
                final = span  # spans come in store order: the latest final reward wins
            else:
                response_rewards += 1
    reward: float | None = None
    comment: str | None = None
    feedback = "awaiting feedback"
    if final is not None:
        value = final.attributes.get(semconv.REWARD_VALUE)
        reward = float(value) if isinstance(value, int | float) and math.isfinite(value) else None
        feedback = "judged" if final.attributes.get(semconv.FEEDBACK_SOURCE) == "judge" else "rated"
        text = final.attributes.get(semconv.FEEDBACK_COMMENT)
        comment = str(text) if text else None
    if rollout.status is t.RolloutStatus.RUNNING:
        state = "open"
    elif rollout.status is t.RolloutStatus.SUCCEEDED:
        state = "closed"
    elif rollout.error is not None and rollout.error.kind is t.ErrorKind.LOST:
        state = "lost"
    else:
        state = rollout.status.value
    segment = meta.get(_META_SEGMENT)
    task = meta.get(_META_TASK)
    return SessionRow(
        session_id=str(meta[META_KEY]),
        segment=int(segment) if isinstance(segment, int) else 0,
        rollout_id=rollout.rollout_id,
        state=state,
        calls=calls,
        feedback=feedback,
        reward=reward,
        response_rewards=response_rewards,
        comment=comment,
        version=rollout.resources_version,
        task_key=task if isinstance(task, str) else None,
        opened_at=rollout.created_at,
        last_active_at=max(last, rollout.ended_at or 0.0),
        ended_at=rollout.ended_at,
    )


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


def _overall(latest: Mapping[str, float]) -> FeedbackShares | None:
    """All-time shares from the serve process's counters (``online/feedback_rate`` is rated /
    closed; judged sessions are counted apart)."""
    if "online/sessions_closed" not in latest:
        return None
    closed = int(latest["online/sessions_closed"])
    judged = int(latest.get("online/judged", 0.0))
    rated = round(latest.get("online/feedback_rate", 0.0) * closed)
    return FeedbackShares(
        closed=closed,
        rated=rated,
        judged=judged,
        unrated=max(0, closed - rated - judged),
        open=int(latest.get("online/sessions_open", 0.0)),
    )


def _decision(row: RunMetrics, gate: Mapping[str, Any] | None) -> DecisionRow:
    v = row.values
    decision = DecisionRow(
        version=int(v["gate/version"]),
        time=row.time,
        passed=v.get("gate/passed", 0.0) >= 0.5,
        reason="",
        candidate_mean=v.get("gate/candidate_mean"),
        candidate_se=v.get("gate/candidate_se"),
        live_mean=v.get("gate/live_mean"),
        live_se=v.get("gate/live_se"),
        delta=v.get("gate/delta"),
        delta_se=v.get("gate/delta_se"),
        bound=v.get("gate/bound"),
        sessions=_int(v.get("train/sessions")),
        rows=_int(v.get("train/rows")),
        train_reward=v.get("train/reward"),
        train_seconds=v.get("train/seconds"),
    )
    decision.reason = _reason(decision, gate)
    return decision


def _reason(d: DecisionRow, gate: Mapping[str, Any] | None) -> str:
    """The gate's reason, in :func:`agentbolt.online.gate.decide`'s words."""
    if d.candidate_mean is None:
        return "no gate configured: every candidate goes live"
    if d.delta is not None and d.bound is not None and d.live_mean is not None:
        verdict = "within" if d.passed else "below"
        tasks = f" over {gate['tasks']} tasks" if gate and "tasks" in gate else ""
        text = (
            f"held-out reward {d.candidate_mean:.3f} vs live {d.live_mean:.3f}{tasks}: "
            f"difference {d.delta:+.3f} (se {d.delta_se or 0.0:.3f}) is {verdict} the noise bound {d.bound:+.3f}"
        )
        if gate and "z" in gate and "tolerance" in gate:
            text += f" (z={float(gate['z']):g}, tolerance {float(gate['tolerance']):g})"
        return text
    if d.eval_rollouts == 0:
        return "the candidate's evaluation ran no rollout"
    max_failed = gate.get("max_failed") if gate else None
    failed = d.eval_failed or 0
    if d.eval_rollouts and failed and (max_failed is None or failed > float(max_failed) * d.eval_rollouts):
        limit = f" (more than {float(max_failed):.0%})" if max_failed is not None else ""
        return (
            f"{failed} of {d.eval_rollouts} evaluation rollouts failed or gave no reward{limit}: the gate cannot tell"
        )
    if d.eval_rollouts is None:
        return "the gate could not compare the candidate with the live version"
    return "the candidate and the live version share no evaluated task"


async def _count_evaluation(store: Store, run_id: str, d: DecisionRow, gate: Mapping[str, Any] | None) -> None:
    """How many evaluation rollouts the candidate ran and how many failed (then the reason again:
    a gate that could not compare says why from these counts)."""
    if d.candidate_mean is None:
        return
    prefix = f"{run_id}:gate:v{d.version}:"
    found: list[t.Rollout] = []
    offset = 0
    while True:
        page = await store.search_rollouts(
            RolloutSearch(run_id=run_id, step=d.version, mode=t.RolloutMode.VAL, limit=1000, offset=offset)
        )
        found += [r for r in page.items if r.rollout_id.startswith(prefix)]
        offset += len(page.items)
        if not page.items or offset >= page.total:
            break
    score = score_of(d.version, found)
    d.eval_rollouts, d.eval_failed = score.rollouts, score.failed
    d.reason = _reason(d, gate)


def _versions(
    run: Run, history: Sequence[RunMetrics], decisions: Sequence[DecisionRow], live: int | None
) -> list[VersionRow]:
    initial = next((int(m.values["serve/live_version"]) for m in history if "serve/live_version" in m.values), None)
    if initial is None:
        initial = live
    rows: list[VersionRow] = []
    promoted = [d for d in decisions if d.passed]
    for d in decisions:
        status = "kept out" if not d.passed else ("live" if d.version == live else "was live")
        rows.append(VersionRow(d.version, status, d.time, d))
    if initial is not None and all(d.version != initial for d in decisions):
        status = "live" if initial == live or (live is None and not promoted) else "was live"
        rows.append(VersionRow(initial, status, run.started_at, None))
    rows.sort(key=lambda r: r.version, reverse=True)
    return rows


def _live_score(
    history: Sequence[RunMetrics], decisions: Sequence[DecisionRow], live: int | None
) -> tuple[float | None, float | None]:
    """The live version's held-out score: its own gate evaluation if it was a candidate, else the
    latest baseline evaluation (``gate/live_mean``)."""
    for d in decisions:
        if d.version == live and d.passed and d.candidate_mean is not None:
            return d.candidate_mean, d.candidate_se
    for m in reversed(history):
        if "gate/live_mean" in m.values and "gate/version" not in m.values:
            return m.values["gate/live_mean"], m.values.get("gate/live_se")
    return None, None
