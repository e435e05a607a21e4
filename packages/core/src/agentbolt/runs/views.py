"""What the dashboard's pages show, computed from the store (no HTML here).

Every function takes an open :class:`~agentbolt.store.Store`, so the pages work the same on
SQLite, PostgreSQL and a store server. The trajectory and reward views run LightningRL on the
stored spans at view time, with the run's own LightningRL settings when it recorded them.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from .. import semconv
from .. import types as t
from ..errors import NotFoundError, UserError
from ..lightningrl import LightningRL, LightningRLConfig
from ..store.base import Store
from ..store.run_records import RolloutSearch, Run
from .answer import RolloutAnswer, rollout_answer
from .summary import HeldoutMetric, heldout_metric

__all__ = [
    "METRIC_PRESETS",
    "POLICY_PLACEHOLDER",
    "CallView",
    "GroupMember",
    "SpanRow",
    "TrajectoryView",
    "fidelity",
    "lightningrl_for",
    "llm_calls",
    "metric_names",
    "policy_family",
    "run_policies",
    "trajectory",
]

METRIC_PRESETS: tuple[tuple[str, str], ...] = (
    ("train/reward", "reward"),
    ("val/reward", "held-out reward"),
    ("val/accuracy", "held-out accuracy"),
    ("update/loss", "loss"),
    ("update/kl", "KL"),
    ("update/entropy", "entropy"),
    ("health/near_certain_share", "tokens with p >= 0.99"),
    ("health/surprisal", "-log p per sampled token"),
    ("health/duplicate_share", "samples repeating their group"),
    ("health/tool_call_rate", "rollouts calling a tool"),
    ("update/tokens_per_s", "tokens/s"),
    ("time/step_s", "s/step"),
)
"""The metrics the Runs page offers first (name, label); any other recorded metric follows."""

log = logging.getLogger(__name__)

_MAX_GROUP = 64  # rollouts of a group processed together at view time


def _json(value: Any) -> Any:
    """A span attribute that may hold JSON text, decoded (else as it is)."""
    if isinstance(value, str) and value[:1] in "[{":
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
    return value


def span_kind(span: t.Span) -> str:
    """A short label: llm, tool, reward, agent, exception, message, operation or span."""
    a = span.attributes
    kind = a.get(semconv.SPAN_KIND_ATTR)
    if isinstance(kind, str):
        return kind
    if semconv.TOKEN_SOURCE in a or span.name == semconv.SPAN_LLM_CALL:
        return "llm"
    op = a.get(semconv.GEN_AI_OPERATION_NAME)
    if op in (semconv.OP_CHAT, semconv.OP_TEXT_COMPLETION, semconv.OP_GENERATE_CONTENT):
        return "llm"
    if op == semconv.OP_EXECUTE_TOOL:
        return "tool"
    if op in (semconv.OP_INVOKE_AGENT, semconv.OP_CREATE_AGENT):
        return "agent"
    if span.name == semconv.SPAN_REWARD:
        return "reward"
    return "span"


@dataclass
class SpanRow:
    """One line of the span tree."""

    span: t.Span
    depth: int
    kind: str
    offset_pct: float
    width_pct: float
    duration_ms: float | None
    summary: str


@dataclass
class Token:
    """One response token with its logprob."""

    id: int
    logprob: float | None
    prob: float | None
    shade: int
    """0 (improbable) .. 4 (near-certain), for colouring."""
    text: str | None = None
    """The token's text, when the recorded reply carries it (OpenAI ``logprobs.content[].token``)."""


@dataclass
class CallView:
    """An LLM call as chat plus its token data."""

    span: t.Span
    index: int | None
    agent_name: str | None
    input_messages: list[dict[str, Any]]
    output_messages: list[dict[str, Any]]
    tools: list[Any]
    prompt_ids: list[int]
    tokens: list[Token]
    token_source: str
    finish_reason: str | None
    policy_version: Any
    latency_s: Any
    transition: t.Transition | None = None
    exclusion: str | None = None
    exclusion_detail: str | None = None


@dataclass(frozen=True)
class GroupMember:
    """One sample of a group, as the group's other samples link to it."""

    rollout_id: str
    reward: float | None
    advantage: float | None
    """The advantage LightningRL gave its calls (held-out samples: ``None``, never trained)."""
    correct: bool | None


@dataclass
class TrajectoryView:
    """Everything the trajectory page shows."""

    rollout: t.Rollout
    run: Run | None
    attempts: list[t.Attempt]
    rows: list[SpanRow]
    calls: list[CallView]
    transitions: list[t.Transition]
    rewards: list[Any]
    final_reward: float | None
    final_source: str | None
    settings: dict[str, Any]
    lightningrl_error: str | None = None
    quarantine: Any = None
    """Why LightningRL quarantined the rollout (a :class:`~agentbolt.lightningrl.Quarantined`), if it did."""
    group_size: int = 0
    notes: dict[str, int] = field(default_factory=dict)
    answer: RolloutAnswer | None = None
    """Question, reply, expected answer and verdict (the page's first screen)."""
    group: list[GroupMember] = field(default_factory=list)
    """The samples of the rollout's group (itself included), in enqueue order."""
    evaluations: list[tuple[int, GroupMember]] = field(default_factory=list)
    """A held-out rollout's question at each evaluation of the run (step, sample), oldest first:
    the same question before and after training, each sample linked."""

    @property
    def held_out(self) -> bool:
        """A validation rollout: evaluated, never trained on (its calls are not transitions the
        algorithm trained)."""
        return self.rollout.mode is t.RolloutMode.VAL


def _messages(value: Any) -> list[dict[str, Any]]:
    """GenAI messages (``parts`` form or OpenAI ``content`` form) as ``{role, text}`` dicts."""
    value = _json(value)
    if isinstance(value, dict):
        value = [value]
    out = []
    for m in value if isinstance(value, list) else []:
        if not isinstance(m, dict):
            continue
        role = str(m.get("role", "?"))
        texts: list[str] = []
        content = m.get("content")
        if isinstance(content, str):
            texts.append(content)
        for part in m.get("parts") or (content if isinstance(content, list) else []):
            if isinstance(part, dict):
                text = part.get("content") or part.get("text")
                if part.get("type") in ("text", None) and isinstance(text, str):
                    texts.append(text)
                elif part.get("type") in ("tool_call", "tool_call_response"):
                    texts.append(orjson.dumps(part, option=orjson.OPT_INDENT_2).decode())
        for call in m.get("tool_calls") or []:
            texts.append(orjson.dumps(call, option=orjson.OPT_INDENT_2).decode())
        out.append({"role": role, "text": "\n".join(texts), "finish_reason": m.get("finish_reason")})
    return out


def _token_row(ids: Sequence[Any], logprobs: Sequence[Any] | None, texts: Sequence[str] | None = None) -> list[Token]:
    out = []
    for i, tid in enumerate(ids):
        lp = logprobs[i] if logprobs is not None and i < len(logprobs) else None
        prob = math.exp(lp) if isinstance(lp, int | float) and math.isfinite(lp) else None
        shade = 0 if prob is None else min(4, int(prob * 5))
        text = texts[i] if texts is not None and len(texts) == len(ids) else None
        out.append(Token(id=int(tid), logprob=lp, prob=prob, shade=shade, text=text))
    return out


def _token_texts(span: t.Span) -> list[str] | None:
    """Each response token's text from the recorded reply's ``logprobs.content`` (Chat
    Completions, as vLLM and agentbolt-torch answer), else ``None``."""
    body = _json(span.attributes.get(semconv.LLM_RESPONSE))
    if not isinstance(body, dict):
        return None
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    logprobs = choices[0].get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(content, list) or not all(
        isinstance(e, dict) and isinstance(e.get("token"), str) for e in content
    ):
        return None
    return [e["token"] for e in content]


def _call_view(span: t.Span) -> CallView:
    a = span.attributes
    request = _json(a.get(semconv.LLM_REQUEST))
    tools = request.get("tools", []) if isinstance(request, dict) else []
    inputs = _messages(a.get(semconv.GEN_AI_INPUT_MESSAGES))
    if not inputs and isinstance(request, dict):
        inputs = _messages(request.get("messages"))
    reasons = a.get(semconv.GEN_AI_RESPONSE_FINISH_REASONS)
    return CallView(
        span=span,
        index=None,
        agent_name=a.get(semconv.GEN_AI_AGENT_NAME),
        input_messages=inputs,
        output_messages=_messages(a.get(semconv.GEN_AI_OUTPUT_MESSAGES)),
        tools=list(tools) if isinstance(tools, list) else [],
        prompt_ids=list(a.get(semconv.PROMPT_TOKEN_IDS, ()) or ()),
        tokens=_token_row(
            a.get(semconv.RESPONSE_TOKEN_IDS, ()) or (), a.get(semconv.RESPONSE_LOGPROBS), _token_texts(span)
        ),
        token_source=str(a.get(semconv.TOKEN_SOURCE, semconv.TOKEN_SOURCE_MISSING)),
        finish_reason=str(reasons[0]) if isinstance(reasons, list | tuple) and reasons else None,
        policy_version=a.get(semconv.POLICY_VERSION),
        latency_s=a.get(semconv.LLM_LATENCY_S),
    )


def llm_calls(spans: Sequence[t.Span]) -> list[CallView]:
    """The captured LLM calls among a rollout's spans (those with a token source), in span order."""
    return [_call_view(s) for s in spans if span_kind(s) == "llm" and semconv.TOKEN_SOURCE in s.attributes]


def _summary(span: t.Span, kind: str) -> str:
    a = span.attributes
    if kind == "reward":
        return f"reward {a.get(semconv.REWARD_VALUE)}"
    if kind == "tool":
        return str(a.get(semconv.GEN_AI_TOOL_NAME, ""))
    if kind == "agent":
        return str(a.get(semconv.GEN_AI_AGENT_NAME, ""))
    if kind == "llm":
        n = len(a.get(semconv.RESPONSE_TOKEN_IDS, ()) or ())
        return f"{n} tokens · {a.get(semconv.TOKEN_SOURCE, 'missing')}"
    if kind == "exception":
        return str(a.get(semconv.EXCEPTION_TYPE, ""))
    return ""


def span_rows(spans: Sequence[t.Span]) -> list[SpanRow]:
    """The spans as a tree (depth-first, children by start time) with timing-bar geometry."""
    if not spans:
        return []
    start = min(s.start_time_ns for s in spans)
    end = max((s.end_time_ns or s.start_time_ns) for s in spans)
    total = max(end - start, 1)
    ids = {s.span_id for s in spans}
    children: dict[str | None, list[t.Span]] = {}
    for s in spans:
        parent = s.parent_span_id if s.parent_span_id in ids else None
        children.setdefault(parent, []).append(s)
    rows: list[SpanRow] = []

    def walk(parent: str | None, depth: int) -> None:
        for s in sorted(children.get(parent, []), key=lambda x: (x.start_time_ns, x.seq or 0)):
            kind = span_kind(s)
            dur = None if s.end_time_ns is None else (s.end_time_ns - s.start_time_ns) / 1e6
            width = 0.0 if s.end_time_ns is None else (s.end_time_ns - s.start_time_ns) / total * 100
            rows.append(
                SpanRow(
                    s, depth, kind, (s.start_time_ns - start) / total * 100, max(width, 0.4), dur, _summary(s, kind)
                )
            )
            walk(s.span_id, depth + 1)

    walk(None, 0)
    return rows


def lightningrl_settings(run: Run | None) -> dict[str, Any]:
    """The :class:`~agentbolt.lightningrl.LightningRLConfig` the run trained with (its recorded
    ``lightningrl`` config, as :meth:`~agentbolt.lightningrl.LightningRLConfig.as_record`), else
    the defaults."""

    config = run.config.get("lightningrl") if run is not None else None
    if isinstance(config, dict):
        try:
            return LightningRLConfig.from_value(config).as_record()
        except UserError as exc:
            log.warning(
                "run %s: recorded LightningRL config is not valid (%s); using the defaults",
                getattr(run, "run_id", None),
                exc,
            )
    return LightningRLConfig().as_record()


def lightningrl_for(run: Run | None) -> Any:
    """A :class:`~agentbolt.lightningrl.LightningRL` configured like the run's (never raises on
    an empty batch)."""

    return LightningRL(lightningrl_settings(run), allow_empty=True)


async def _run_or_none(store: Store, run_id: str | None) -> Run | None:
    if run_id is None:
        return None
    try:
        return await store.get_run(run_id)
    except NotFoundError:
        return None


async def trajectory(store: Store, rollout_id: str) -> TrajectoryView:
    """The trajectory page of one rollout (``NotFoundError`` for an unknown id)."""
    (rollout,) = await store.get_rollouts([rollout_id])
    run = await _run_or_none(store, rollout.run_id)
    attempts = await store.get_attempts(rollout_id)
    spans = (await store.query_spans([rollout_id], latest_attempt_only=True))[rollout_id]
    calls = llm_calls(spans)
    view = TrajectoryView(
        rollout=rollout,
        run=run,
        attempts=attempts,
        rows=span_rows(spans),
        calls=calls,
        transitions=[],
        rewards=[],
        final_reward=rollout.final_reward,
        final_source=None,
        settings=lightningrl_settings(run),
    )
    # Advantages are relative to the group: process the rollout's group as the algorithm did.
    group = [rollout]
    if rollout.group_id is not None:
        page = await store.query_rollouts(group_id=rollout.group_id, limit=_MAX_GROUP)
        group = [r for r in page.items if r.status.is_final] or [rollout]
        if all(r.rollout_id != rollout_id for r in group):
            group.append(rollout)
    view.group_size = len(group)
    metric = heldout_metric(run.config if run is not None else None)
    view.answer = rollout_answer(rollout, calls, spans, metric)
    if rollout.mode is t.RolloutMode.VAL and rollout.run_id is not None and rollout.task_id:
        view.evaluations = await _same_question(store, rollout, metric)
    group_spans = await store.query_spans([r.rollout_id for r in group], latest_attempt_only=True)
    try:
        batch = lightningrl_for(run).process(group, group_spans)
    except Exception as exc:  # show why instead of failing the page
        view.lightningrl_error = f"{type(exc).__name__}: {exc}"
        return view
    advantage: dict[str, float] = {}
    for x in batch.transitions:
        if x.advantage is not None:
            advantage.setdefault(x.rollout_id, x.advantage)
    view.group = [
        GroupMember(
            r.rollout_id,
            r.final_reward,
            None if r.mode is t.RolloutMode.VAL else advantage.get(r.rollout_id),
            None if metric is None else metric.correct(r),
        )
        for r in sorted(group, key=lambda r: (r.created_at, r.rollout_id))
    ]
    view.transitions = [x for x in batch.transitions if x.rollout_id == rollout_id]
    view.quarantine = next((q for q in batch.report.quarantined if q.rollout_id == rollout_id), None)
    by_span = {x.span_id: x for x in view.transitions}
    episode = next((e for e in batch.episodes if e.rollout_id == rollout_id), None)
    if episode is not None:
        view.rewards = list(episode.rewards)
        view.final_reward = episode.final_reward
        view.final_source = episode.final_source
        if view.answer is not None and episode.final_reward is not None:
            view.answer = replace(view.answer, reward=episode.final_reward)
        view.notes = dict(episode.notes)
        by_gateway = {c.gateway_span.span_id: c for c in episode.calls if c.gateway_span is not None}
        for call in view.calls:
            found = by_gateway.get(call.span.span_id)
            if found is not None:
                call.index = found.index
                call.agent_name = found.agent_name or call.agent_name
                call.exclusion = found.exclusion.value if found.exclusion is not None else None
                call.exclusion_detail = found.exclusion_detail
            call.transition = by_span.get(call.span.span_id)
    return view


async def _same_question(
    store: Store, rollout: t.Rollout, metric: HeldoutMetric | None
) -> list[tuple[int, GroupMember]]:
    """The run's held-out rollouts of the same task, by evaluation step (oldest first)."""
    found = await store.search_rollouts(
        RolloutSearch(run_id=rollout.run_id, mode=t.RolloutMode.VAL, text=rollout.task_id, limit=200)
    )
    out = []
    for r in found.items:
        if r.task_id != rollout.task_id or r.step is None:
            continue
        correct = None if metric is None else metric.correct(r)
        out.append((r.step, GroupMember(r.rollout_id, r.final_reward, None, correct)))
    return sorted(out, key=lambda x: (x[0], x[1].rollout_id))


async def fidelity(store: Store, rollout_ids: Sequence[str]) -> dict[str, int]:
    """LLM calls by ``token_source`` (exact / retokenized / missing) among these rollouts."""
    counts: Counter[str] = Counter({semconv.TOKEN_SOURCE_EXACT: 0, semconv.TOKEN_SOURCE_RETOKENIZED: 0})
    counts[semconv.TOKEN_SOURCE_MISSING] = 0
    ids = list(rollout_ids)
    for i in range(0, len(ids), 200):
        for spans in (await store.query_spans(ids[i : i + 200], latest_attempt_only=True)).values():
            for s in spans:
                if semconv.TOKEN_SOURCE in s.attributes:
                    counts[str(s.attributes[semconv.TOKEN_SOURCE])] += 1
    return dict(counts)


POLICY_PLACEHOLDER = "{policy}"
"""Stands for each policy's name in a per-policy metric family (``train/{policy}/loss``)."""


def run_policies(config: Mapping[str, Any] | None) -> list[str]:
    """The policies by role a run recorded (``config["policies"]``; empty for one shared policy)."""
    policies = (config or {}).get("policies")
    return [str(name) for name in policies] if isinstance(policies, Mapping) else []


def policy_family(metric: str, policies: Sequence[str]) -> str | None:
    """``train/{policy}/loss`` for ``train/writer/loss`` when ``writer`` is one of ``policies``."""
    parts = metric.split("/")
    for i, part in enumerate(parts):
        if part in policies:
            return "/".join([*parts[:i], POLICY_PLACEHOLDER, *parts[i + 1 :]])
    return None


def metric_names(latest: Mapping[str, float], policies: Sequence[str] = ()) -> list[tuple[str, str]]:
    """Presets first (those recorded), then per-policy families (one curve per policy, for runs with
    policies by role), then every other recorded metric, as (name, label)."""
    names = [(k, label) for k, label in METRIC_PRESETS if k in latest]
    known = {k for k, _ in names}
    families = sorted({f for k in latest if (f := policy_family(k, policies)) is not None})
    names += [(f, f"{f.replace('/' + POLICY_PLACEHOLDER, '')} per policy") for f in families]
    return names + [(k, k) for k in sorted(latest) if k not in known]
