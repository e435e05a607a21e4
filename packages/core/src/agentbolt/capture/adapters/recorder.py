"""The span side of adapters: :class:`UnitRecord` (what an adapter translates a framework event
to), :class:`SpanRecorder` (which turns units into spans of the rollout current at their start)
and :func:`never_raises` (the guard on every method a host framework calls)."""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from opentelemetry import trace as otel_trace

from ... import semconv
from ... import types as t
from ..tracing import RolloutContext, current_rollout

__all__ = ["SpanRecorder", "UnitRecord", "in_rollout", "never_raises"]

log = logging.getLogger(__name__)

_KINDS = {
    semconv.KIND_AGENT: semconv.OP_INVOKE_AGENT,
    semconv.KIND_LLM: semconv.OP_CHAT,
    semconv.KIND_TOOL: semconv.OP_EXECUTE_TOOL,
}
_F = TypeVar("_F", bound=Callable[..., Any])


def never_raises(what: str, *, when_active: bool = False) -> Callable[[_F], _F]:
    """Decorate a method the host framework calls: an exception it raises is counted and logged
    once per kind by ``self.guard(what, exc)`` (:meth:`AdapterHooks.guard`,
    :meth:`SpanRecorder.guard`) and the method returns ``None``. The framework never sees it.

    ``when_active=True`` (framework callbacks of :class:`AdapterHooks`): the method does nothing
    and returns ``None`` while the hooks are not :attr:`~AdapterHooks.active` (no adapter
    instrumented), so each callback need not check."""

    def decorate(fn: _F) -> _F:
        @functools.wraps(fn)
        def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
            if when_active and not self.active:
                return None
            try:
                return fn(self, *args, **kwargs)
            except Exception as exc:
                self.guard(what, exc)
                return None

        return guarded  # type: ignore[return-value]  # fn's signature; None where fn raised (the framework ignores it)

    return decorate


def in_rollout() -> bool:
    """A rollout that records spans is current (not a run with ``sink=None``, e.g. an agent's
    unit test): what adapters check before translating a framework event."""
    ctx = current_rollout()
    return ctx is not None and ctx.sink is not None


@dataclass
class UnitRecord:
    """A unit of framework work in progress (what an adapter translates a framework event to)."""

    kind: str
    """``agent``, ``llm``, ``tool``, or another :mod:`agentbolt.semconv` ``KIND_*`` value."""
    name: str
    """Span name, e.g. ``invoke_agent writer`` or ``chat gpt-4o``."""
    attributes: dict[str, Any] = field(default_factory=dict)
    """GenAI attributes (``gen_ai.agent.name``, ``gen_ai.tool.name``, ``gen_ai.response.id``, ...)."""
    start_ns: int = 0
    """Start time; now when 0."""


@dataclass
class _Open:
    ctx: RolloutContext
    span_id: str
    trace_id: str
    parent_span_id: str | None
    record: UnitRecord


class SpanRecorder:
    """Builds spans from framework units and routes them to the rollout current at their start.

    Units are keyed by the framework's own ids (``run_id``, span ids); a unit's parent is looked
    up by the framework's parent id, so the tree is rebuilt exactly, whatever thread or task the
    framework reports from. Framework units an adapter does not record (a LangChain
    ``RunnableSequence``, an Agents SDK turn span) are :meth:`skip` ped: their children attach to
    the nearest recorded ancestor. Every public method swallows (and logs once per error type)
    any exception: the host framework never sees one.
    """

    def __init__(self, adapter: str) -> None:
        self.adapter = adapter
        self._open: dict[Hashable, _Open] = {}
        self._skipped: dict[Hashable, Hashable] = {}
        """Framework keys not recorded -> key of their nearest recorded ancestor."""
        self._lock = threading.Lock()
        self._logged: set[str] = set()
        self.errors = 0

    def guard(self, what: str, exc: BaseException) -> None:
        """Count and log (once per kind) an error of the adapter's own translation code."""
        self.errors += 1
        kind = f"{what}:{type(exc).__name__}"
        if kind not in self._logged:
            self._logged.add(kind)
            log.warning(
                "%s adapter: %s failed (%r); recording continues, the framework is unaffected", self.adapter, what, exc
            )

    def resolve(self, key: Hashable | None) -> Hashable | None:
        """The recorded unit that stands for the framework's ``key``: itself when it is open, its
        nearest recorded ancestor when it was skipped, else ``None``."""
        if key is None:
            return None
        with self._lock:
            if key in self._open:
                return key
            return self._skipped.get(key)

    @never_raises("skip")
    def skip(self, key: Hashable, parent_key: Hashable | None) -> None:
        """The framework unit ``key`` is not recorded: units naming it as their parent attach to
        ``parent_key``'s recorded unit (nothing when there is none) until ``end(key)``."""
        parent = self.resolve(parent_key)
        if parent is not None:
            with self._lock:
                if key not in self._open:
                    self._skipped[key] = parent

    def idle(self) -> bool:
        """No unit is open or skipped (read without the lock: callbacks use it to say early that
        an event outside rollouts is of no interest)."""
        return not self._open and not self._skipped

    @never_raises("start")
    def start(self, key: Hashable, record: UnitRecord, *, parent_key: Hashable | None = None) -> None:
        """A unit began. Ignored outside rollouts (unless its parent belongs to one)."""
        parent_key = self.resolve(parent_key)
        with self._lock:
            parent = self._open.get(parent_key) if parent_key is not None else None
        ctx = current_rollout()
        if ctx is None or ctx.sink is None:
            if parent is None:
                return
            ctx = parent.ctx  # e.g. a callback reported from another thread
        elif parent is not None and parent.ctx.rollout_id != ctx.rollout_id:
            parent = None
        if parent is None:
            trace_id, parent_span = _otel_parent()
            trace_id = trace_id or os.urandom(16).hex()
        else:
            trace_id, parent_span = parent.trace_id, parent.span_id
        if not record.start_ns:
            record.start_ns = time.time_ns()
        with self._lock:
            self._open[key] = _Open(ctx, os.urandom(8).hex(), trace_id, parent_span, record)

    @never_raises("update")
    def update(self, key: Hashable, attributes: Mapping[str, Any]) -> None:
        """Add attributes to an open unit (e.g. the response id once the LLM answered)."""
        with self._lock:
            unit = self._open.get(key)
        if unit is not None:
            unit.record.attributes.update({k: v for k, v in attributes.items() if v is not None})

    @never_raises("end")
    def end(
        self,
        key: Hashable,
        *,
        attributes: Mapping[str, Any] | None = None,
        error: BaseException | str | None = None,
        end_ns: int | None = None,
        name: str | None = None,
    ) -> t.Span | None:
        """A unit ended: emit its span (status ERROR with the error when given; ``name``
        renames it, for units whose name is known only at the end). A skipped or unknown
        ``key`` is forgotten and nothing is emitted."""
        with self._lock:
            unit = self._open.pop(key, None)
            self._skipped.pop(key, None)
        if unit is None:
            return None
        attrs = dict(unit.record.attributes)
        attrs.update({k: v for k, v in (attributes or {}).items() if v is not None})
        attrs[semconv.SPAN_KIND_ATTR] = unit.record.kind
        attrs.setdefault(semconv.GEN_AI_OPERATION_NAME, _KINDS.get(unit.record.kind, unit.record.kind))
        attrs.pop(semconv.TOKEN_SOURCE, None)  # only the gateway states token provenance
        attrs[semconv.ADAPTER] = self.adapter
        status = t.SpanStatus()
        events: list[t.SpanEvent] = []
        if error is not None:
            message = str(error) if not isinstance(error, BaseException) else f"{type(error).__name__}: {error}"
            status = t.SpanStatus(code=t.StatusCode.ERROR, message=message[:2000])
            attrs[semconv.ERROR_TYPE] = type(error).__name__ if isinstance(error, BaseException) else "error"
            if isinstance(error, BaseException):
                info = t.ErrorInfo.from_exception(error)
                events.append(
                    t.SpanEvent(
                        name="exception",
                        time_ns=time.time_ns(),
                        attributes={
                            semconv.EXCEPTION_TYPE: info.type,
                            semconv.EXCEPTION_MESSAGE: info.message,
                            semconv.EXCEPTION_STACKTRACE: info.traceback or "",
                        },
                    )
                )
        # Attributes went through _clean (primitives, lists of str/int, finite floats only), so the
        # span is built without re-validating it: adapters run inside the agent's hot path.
        span = t.Span.model_construct(
            rollout_id=unit.ctx.rollout_id,
            attempt_id=unit.ctx.attempt_id,
            trace_id=unit.trace_id,
            span_id=unit.span_id,
            parent_span_id=unit.parent_span_id,
            name=name or unit.record.name,
            kind=t.SpanKind.CLIENT if unit.record.kind == semconv.KIND_LLM else t.SpanKind.INTERNAL,
            start_time_ns=unit.record.start_ns,
            end_time_ns=end_ns or time.time_ns(),
            status=status,
            attributes=_clean(attrs),
            events=events,
            links=[],
            resource={},
            scope=f"agentbolt.adapter.{self.adapter}",
            schema_version=semconv.SCHEMA_VERSION,
            seq=None,
        )
        unit.ctx.record(span)
        return span

    @never_raises("translate")
    def translate(self, span: t.Span, record: UnitRecord) -> t.Span | None:
        """``span`` (captured from another instrumentation's OpenTelemetry span) as this adapter's
        unit: ``record``'s attributes added over the span's own (which are kept), marked with its
        kind and this adapter, renamed to ``record.name`` when given. Its ids, parent, times and
        status stay the instrumentation's. ``None`` when translating fails (counted and logged
        once: the span is then stored as it was)."""
        attrs = dict(span.attributes)
        attrs.update({k: v for k, v in record.attributes.items() if v is not None})
        attrs[semconv.SPAN_KIND_ATTR] = record.kind
        attrs.setdefault(semconv.GEN_AI_OPERATION_NAME, _KINDS.get(record.kind, record.kind))
        attrs.pop(semconv.TOKEN_SOURCE, None)  # only the gateway states token provenance
        attrs[semconv.ADAPTER] = self.adapter
        return span.model_copy(update={"attributes": _clean(attrs), "name": record.name or span.name})

    def span_id_of(self, key: Hashable) -> str | None:
        """The span id given to an open unit (to link framework ids to spans; ``None``: the unit
        is not recorded, e.g. it started outside rollouts)."""
        context = self.context_of(key)
        return None if context is None else context[1]

    def context_of(self, key: Hashable) -> tuple[str, str] | None:
        """(trace id, span id) of an open unit."""
        with self._lock:
            unit = self._open.get(key)
        return None if unit is None else (unit.trace_id, unit.span_id)

    def otel_context_of(self, key: Hashable) -> Any:
        """An OpenTelemetry context whose current span is the open unit's span, to make it the
        parent of the framework's own OpenTelemetry spans (``None`` when ``key`` is not open)."""
        ids = self.context_of(key)
        if ids is None:
            return None
        trace_id, span_id = ids
        flags = otel_trace.TraceFlags(otel_trace.TraceFlags.SAMPLED)
        span_context = otel_trace.SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=False, trace_flags=flags)
        return otel_trace.set_span_in_context(otel_trace.NonRecordingSpan(span_context))

    def discard_all(self) -> None:
        """Forget open and skipped units (at uninstrument)."""
        with self._lock:
            self._open.clear()
            self._skipped.clear()


def _otel_parent() -> tuple[str | None, str | None]:
    ctx = otel_trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None, None
    return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")


def _clean(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """Keep OpenTelemetry-compatible values; JSON-encode structured ones instead of failing."""
    out: dict[str, Any] = {}
    for k, v in attrs.items():
        if v is None:
            continue
        if isinstance(v, float) and not math.isfinite(v):
            out[k] = str(v)
        elif isinstance(v, str | bool | int | float):
            out[k] = v
        elif (isinstance(v, list | tuple) and all(isinstance(x, str) for x in v)) or (
            isinstance(v, list | tuple) and all(isinstance(x, int) and not isinstance(x, bool) for x in v)
        ):
            out[k] = list(v)
        else:
            out[k] = json.dumps(v, default=str)[:65536]
    return out
