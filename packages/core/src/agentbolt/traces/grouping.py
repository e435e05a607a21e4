"""Which rollout a traced span belongs to, and when a trace is complete.

**Grouping.** By default each trace (OpenTelemetry trace id) is one rollout. With
``group_by="session.id"`` (any attribute name: OpenInference's ``session.id``, OpenLLMetry's
``traceloop.association.properties.session_id``, GenAI's ``gen_ai.conversation.id``...) every
trace whose spans carry that attribute (on a span or on its resource) joins the rollout of its
value, so a multi-turn conversation traced as several traces is one rollout. A trace is assigned
as soon as one of its spans names the session; its spans that arrived before are held (in memory)
until then, and a trace that never names one becomes a rollout of its own when its root span
arrives. Held spans are stored when the ingestor stops, but a process killed outright loses them.

**Ids.** A group's rollout id is derived from the run and the key alone
(``{run}:trace:{trace id}``, ``{run}:session:{value}``): a retried export, a restarted ingest
process or feedback sent days later find the same rollout without any table.

**Completion.** A group is complete when every trace in it has delivered its root span (a span
without a parent: exporters send a span when it ends, so the root arriving means the trace's
work is over) and no new span arrived for ``quiet_s`` seconds (spans of one trace can travel in
several batches, out of order). A group whose root never comes is completed anyway
``max_open_s`` after its first span (the status says ``no root span``). Spans arriving after
completion still attach to the rollout (counted as late); rewards may come at any time.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import semconv
from .. import types as t

__all__ = ["GroupState", "TraceGrouping", "group_rollout_id"]

_UNSAFE = re.compile(r"[^A-Za-z0-9._:@-]")
_MAX_KEY = 128


def group_rollout_id(run_id: str, kind: str, key: str) -> str:
    """The rollout id of a trace (``kind="trace"``) or a session (``kind="session"``) of a run.

    Keys with characters outside ``[A-Za-z0-9._:@-]`` or longer than 128 characters are replaced
    by a hash of themselves (stable across processes)."""
    if _UNSAFE.search(key) or len(key) > _MAX_KEY:
        key = "h" + hashlib.sha256(key.encode()).hexdigest()[:32]
    return f"{run_id}:{kind}:{key}"


@dataclass
class GroupState:
    """What the ingest process knows about one traced rollout (rebuilt from the store on restart)."""

    kind: str
    """``trace`` or ``session``."""
    key: str
    """The trace id, or the session attribute's value."""
    rollout_id: str
    attempt_id: str = ""
    trace_ids: set[str] = field(default_factory=set)
    rooted: set[str] = field(default_factory=set)
    """Trace ids whose root span arrived."""
    span_ids: set[str] = field(default_factory=set)
    """Unique spans stored (retried ones are counted once)."""
    first_at: float = 0.0
    last_at: float = 0.0
    """Clock time of the first and the latest new span."""
    llm_calls: int = 0
    retokenized: int = 0
    """LLM calls whose ids were rebuilt and passed the drift check."""
    excluded: Counter[str] = field(default_factory=Counter)
    """LLM calls that will not train, by reason (``token_drift``, ``no_token_ids: ...``)."""
    tool_calls: int = 0
    agents: set[str] = field(default_factory=set)
    duplicates: int = 0
    """Spans received again (exporter retries)."""
    late: int = 0
    """New spans that arrived after completion."""
    completed: bool = False
    closing: bool = False
    """Being completed right now (by the keeper or :meth:`~.ingest.TraceIngestor.complete_all`)."""
    completion_note: str | None = None
    reward: float | None = None
    reward_source: str | None = None

    def complete_due(self, now: float, quiet_s: float, max_open_s: float) -> bool:
        """Whether the group should complete now (see the module docstring)."""
        if self.completed or self.closing or not self.span_ids:
            return False
        if self.trace_ids and self.trace_ids <= self.rooted and now - self.last_at >= quiet_s:
            return True
        return now - self.first_at >= max_open_s

    def count(self, span: t.Span, now: float) -> bool:
        """Count a stored span; False when it was counted before (a retry)."""
        if span.span_id in self.span_ids:
            self.duplicates += 1
            return False
        if not self.span_ids:
            self.first_at = now
        self.span_ids.add(span.span_id)
        self.last_at = now
        if self.completed:
            self.late += 1
        self.trace_ids.add(span.trace_id)
        if span.parent_span_id is None:
            self.rooted.add(span.trace_id)
        kind = span.attributes.get(semconv.SPAN_KIND_ATTR)
        if kind == semconv.KIND_AGENT:
            name = span.attributes.get(semconv.GEN_AI_AGENT_NAME)
            if isinstance(name, str) and name:
                self.agents.add(name)
        elif kind == semconv.KIND_TOOL:
            self.tool_calls += 1
        elif kind == semconv.KIND_LLM:
            self.llm_calls += 1
            reason = "failed_call" if span.status.code is t.StatusCode.ERROR else exclusion_of(span.attributes)
            if reason is None:
                self.retokenized += 1
            else:
                self.excluded[reason] += 1
        return True


def exclusion_of(attrs: Mapping[str, Any]) -> str | None:
    """Why a traced LLM call will not train (``None``: its ids were rebuilt and check out)."""
    if attrs.get(semconv.TOKEN_SOURCE) != semconv.TOKEN_SOURCE_RETOKENIZED:
        why = attrs.get(semconv.TOKEN_MISSING_REASON)
        return f"no_token_ids: {why}" if why else "no_token_ids"
    if attrs.get(semconv.TOKEN_DRIFT):
        return "token_drift"
    return None


class TraceGrouping:
    """Assigns spans to groups (see the module docstring); no I/O.

    Args:
        run_id: the run whose rollouts these are.
        group_by: ``None`` (one rollout per trace) or the name of the session attribute.
    """

    def __init__(self, run_id: str, group_by: str | None = None) -> None:
        self.run_id = run_id
        self.group_by = group_by
        self.trace_group: dict[str, tuple[str, str]] = {}
        """Trace id -> (kind, key) of its group."""
        self.held: dict[str, list[t.Span]] = {}
        """Session grouping: spans of traces whose session is not known yet, by trace id."""
        self.held_at: dict[str, float] = {}
        """Clock time each held trace's first span was held."""

    def session_of(self, span: t.Span) -> str | None:
        """The session attribute's value on the span or its resource (``None``: not named)."""
        if self.group_by is None:
            return None
        value = span.attributes.get(self.group_by)
        if value is None:
            value = span.resource.get(self.group_by)
        if value is None or value == "":
            return None
        return str(value)

    def assign(self, spans: list[t.Span], now: float = 0.0) -> dict[tuple[str, str], list[t.Span]]:
        """Spans by the group they belong to, ``(kind, key)``; spans still waiting for their
        trace's session are held (released by a later call, or by :meth:`release_held`)."""
        out: dict[tuple[str, str], list[t.Span]] = {}
        if self.group_by is None:
            for span in spans:
                out.setdefault(("trace", span.trace_id), []).append(span)
            return out
        for span in spans:  # a span naming its session assigns its trace
            session = self.session_of(span)
            if session is not None and span.trace_id not in self.trace_group:
                self.trace_group[span.trace_id] = ("session", session)
        for span in spans:
            group = self.trace_group.get(span.trace_id)
            if group is None and span.parent_span_id is None:  # the root names no session: its own rollout
                group = self.trace_group[span.trace_id] = ("trace", span.trace_id)
            if group is None:
                self.held.setdefault(span.trace_id, []).append(span)
                self.held_at.setdefault(span.trace_id, now)
            else:
                out.setdefault(group, []).extend(self.held.pop(span.trace_id, []))
                out[group].append(span)
        for trace_id in [tid for tid in self.held if tid in self.trace_group]:
            out.setdefault(self.trace_group[trace_id], []).extend(self.held.pop(trace_id))
            self.held_at.pop(trace_id, None)
        for assigned in out.values():
            for span in assigned:
                self.held_at.pop(span.trace_id, None)
        return out

    def release_held(self, older_than: float | None = None) -> dict[tuple[str, str], list[t.Span]]:
        """Held spans of traces held since before ``older_than`` (default: all) as rollouts of
        their own traces: what happens to a trace that never names a session nor delivers its root."""
        out: dict[tuple[str, str], list[t.Span]] = {}
        for trace_id in list(self.held):
            if older_than is not None and self.held_at.get(trace_id, 0.0) > older_than:
                continue
            self.held_at.pop(trace_id, None)
            spans = self.held.pop(trace_id, [])
            if spans:
                self.trace_group[trace_id] = ("trace", trace_id)
                out[("trace", trace_id)] = spans
        return out

    def rollout_id(self, kind: str, key: str) -> str:
        return group_rollout_id(self.run_id, kind, key)
