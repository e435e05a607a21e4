"""Framework adapters: structure (agents, tool calls, LLM calls) as spans of the current rollout.

Adapters translate; core emits. An adapter hooks into a framework through the framework's
official extension points and, for each unit of work the framework reports (an agent or graph
node run, an LLM call, a tool call), hands a small record to :class:`SpanRecorder`, which
builds the span, rebuilds the tree from the framework's own ids, attributes it to the rollout
that was current when the unit started, and never lets an error reach the framework.

LLM spans from adapters carry ``gen_ai.response.id``, the id of the response the gateway
recorded with exact token ids; LightningRL joins the two, so transitions get the agent name of
the enclosing agent span. Adapters never write ``agentbolt.llm.token_source`` (only the gateway
does).

Runners instrument every installed adapter plugin at start (see
:func:`instrument_adapters`); the user's code needs no change.

Every adapter package has the same skeleton (``agentbolt_<framework>``)::

    plugin.py     registers the adapter factory (imports neither the framework nor the adapter)
    adapter.py    the Adapter subclass: name, framework distribution and supported versions,
                  options, make_hooks() (imports the hooks module lazily)
    _hooks.py     (or _handler.py, _processor.py) the AdapterHooks subclass: the framework
                  translation; it and the private modules it uses are the only ones that
                  import the framework
    errors.py     the package's warnings and errors, when it has any
    __init__.py   the public names and ``__version__``; ``py.typed``

What they share lives here: the lifecycle (:class:`Adapter`: version check, install once per
process, idempotent instrument/uninstrument), the hooks' state and guards
(:class:`AdapterHooks`, :func:`never_raises`), and the span building (:class:`SpanRecorder`).
Attribute names come from :mod:`agentbolt.semconv`; framework-specific ones are spelt in the
framework's namespace (``autogen.*``, ``langgraph.*``, ``openai_agents.*``) in the hooks module.
"""

from __future__ import annotations

import abc
import contextlib
import functools
import importlib.metadata
import logging
import math
import os
import threading
import time
import warnings
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, TypeVar

from opentelemetry import trace as otel_trace
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from . import semconv
from . import types as t
from .errors import MissingDependencyError, UserError
from .tracing import RolloutContext, current_rollout

__all__ = [
    "Adapter",
    "AdapterHooks",
    "SpanRecorder",
    "UnitRecord",
    "capture_span",
    "check_distribution",
    "in_rollout",
    "instrument_adapters",
    "never_raises",
    "tool_call",
    "unix_ns",
]

log = logging.getLogger(__name__)

_KINDS = {
    semconv.KIND_AGENT: semconv.OP_INVOKE_AGENT,
    semconv.KIND_LLM: semconv.OP_CHAT,
    semconv.KIND_TOOL: semconv.OP_EXECUTE_TOOL,
}


class Adapter(abc.ABC):
    """Base class of framework adapters: the lifecycle every adapter shares.

    Subclasses set :attr:`name`, :attr:`distribution` (the framework's distribution, whose
    version is checked) and :attr:`supported` (a PEP 440 specifier), and implement
    :meth:`make_hooks`, which builds the adapter's :class:`AdapterHooks` (the framework
    translation). The hooks are process-wide: built once per adapter class, on the class (the
    one place an adapter's state lives), installed into the framework when the first instance is
    instrumented and removed when the last one is uninstrumented, so two instances never record
    a unit twice. ``instrument()`` and ``uninstrument()`` are idempotent and thread-safe; an
    ``instrument()`` that raises leaves nothing installed, and :func:`instrument_adapters`
    reports why (runners record it for ``agentbolt dev`` / ``agentbolt doctor``).
    """

    name: ClassVar[str] = "adapter"
    distribution: ClassVar[str] = ""
    supported: ClassVar[str] = ""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._instrumented = False

    @classmethod
    @abc.abstractmethod
    def make_hooks(cls) -> AdapterHooks:
        """Build the process's hooks into the framework (imports the framework; called once)."""

    @classmethod
    def shared_hooks(cls) -> AdapterHooks:
        """The process's hooks of this adapter class (built on first use)."""
        hooks = cls.__dict__.get("_shared_hooks")
        if hooks is None:
            with _SHARED_LOCK:
                hooks = cls.__dict__.get("_shared_hooks")
                if hooks is None:
                    hooks = cls.make_hooks()
                    cls._shared_hooks = hooks  # type: ignore[attr-defined]
        return hooks  # type: ignore[no-any-return]

    @property
    def hooks(self) -> AdapterHooks:
        """The hooks shared by every instance of this adapter class."""
        return type(self).shared_hooks()

    @property
    def recorder(self) -> SpanRecorder:
        """The recorder the hooks hand units to (shared by every instance, for the process)."""
        return self.hooks.recorder

    @property
    def instrumented(self) -> bool:
        return self._instrumented

    def check_version(self) -> str:
        """The installed framework version; raises a clear error when missing or unsupported."""
        return check_distribution(self.distribution, self.supported, f"the {self.name} adapter")

    def instrument(self) -> None:
        """Start recording the framework's runs as spans (no-op if already instrumented)."""
        with self._lock:
            if self._instrumented:
                return
            self.check_version()
            self.hooks.acquire(self)
            self._instrumented = True

    def uninstrument(self) -> None:
        """Stop recording (no-op if not instrumented)."""
        with self._lock:
            if not self._instrumented:
                return
            self.hooks.release(self)
            self._instrumented = False


def check_distribution(distribution: str, supported: str, what: str) -> str:
    """The installed version of ``distribution``; a clear error when it is missing or outside
    the PEP 440 specifier ``supported`` (empty: any version)."""
    try:
        installed = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        raise MissingDependencyError(distribution, distribution, what) from None
    if supported and Version(installed) not in SpecifierSet(supported):
        raise UserError(
            f"{what} supports {distribution}{supported}, but {installed} is installed; "
            f"install a supported version (pip install '{distribution}{supported}')"
        )
    return installed


_SHARED_LOCK = threading.Lock()
_F = TypeVar("_F", bound=Callable[..., Any])


def never_raises(what: str) -> Callable[[_F], _F]:
    """Decorate a method the host framework calls: an exception it raises is counted and logged
    once per kind by ``self.guard(what, exc)`` (:meth:`AdapterHooks.guard`,
    :meth:`SpanRecorder.guard`) and the method returns ``None``. The framework never sees it."""

    def decorate(fn: _F) -> _F:
        @functools.wraps(fn)
        def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return fn(self, *args, **kwargs)
            except Exception as exc:
                self.guard(what, exc)
                return None

        return guarded  # type: ignore[return-value]

    return decorate


def in_rollout() -> bool:
    """A rollout that records spans is current (not a run with ``sink=None``, e.g. an agent's
    unit test): what adapters check before translating a framework event."""
    ctx = current_rollout()
    return ctx is not None and ctx.sink is not None


def unix_ns(value: Any) -> int:
    """Unix nanoseconds of a framework's timestamp: a ``datetime``, an ISO-8601 string or Unix
    seconds; 0 when unknown (:class:`SpanRecorder` then uses now)."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return 0
    if isinstance(value, datetime):
        return int(value.timestamp() * 1_000_000) * 1000
    if isinstance(value, int | float) and not isinstance(value, bool):
        return int(value * 1e9)
    return 0


def tool_call(call_id: Any, name: Any, arguments: Any) -> dict[str, Any]:
    """A tool call as ``gen_ai.output.messages`` hold it (an OpenAI chat ``tool_calls`` entry)."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


class AdapterHooks(abc.ABC):
    """An adapter's hooks into its framework (a callback handler, a trace or span processor, a
    patched method): one object per adapter class and process, shared by every instance.

    :meth:`install` runs when the first instance is instrumented and :meth:`uninstall` when the
    last one is uninstrumented (both under :attr:`lock`); :attr:`active` says, without a lock,
    whether framework callbacks should record. Callbacks translate framework events into
    :class:`UnitRecord` s for :attr:`recorder`, and never raise into the framework: decorate them
    with :func:`never_raises` (or call :meth:`guard` in an ``except``). Capture problems the user
    must act on go through :meth:`warn`.
    """

    def __init__(self, adapter: str) -> None:
        self.adapter = adapter
        self.recorder = SpanRecorder(adapter)
        self.lock = threading.RLock()
        self.active = False
        """Whether callbacks record (read without the lock: a plain attribute read is atomic)."""
        self._owners: list[Adapter] = []
        self._said: set[str] = set()
        self._patches: list[tuple[type, str, Any, Any]] = []

    @property
    def owner(self) -> Adapter | None:
        """The first instrumented instance (whose options apply), or ``None``."""
        owners = self._owners
        return owners[0] if owners else None

    def check(self) -> None:  # noqa: B027 - optional hook
        """Raise a clear error when the framework is configured so that capture cannot work
        (called by every ``instrument()``, before :meth:`install`)."""

    @abc.abstractmethod
    def install(self) -> None:
        """Hook into the framework (idempotent across install/uninstall cycles)."""

    @abc.abstractmethod
    def uninstall(self) -> None:
        """Unhook from the framework, or make the hooks inert where it offers no way to unhook."""

    def acquire(self, adapter: Adapter) -> None:
        """``adapter`` is instrumented: install the hooks if it is the first."""
        with self.lock:
            self.check()
            if not self.active:
                try:
                    self.install()
                except BaseException:
                    with contextlib.suppress(Exception):
                        self.uninstall()
                    self._unpatch()
                    raise
                self.active = True
            if not any(o is adapter for o in self._owners):
                self._owners.append(adapter)

    def release(self, adapter: Adapter) -> None:
        """``adapter`` is uninstrumented: uninstall the hooks if it was the last."""
        with self.lock:
            self._owners = [o for o in self._owners if o is not adapter]
            if self._owners or not self.active:
                return
            self.active = False
            try:
                self.uninstall()
            finally:
                self._unpatch()
                self.recorder.discard_all()

    def patch(self, owner: type, name: str, wrap: Callable[[Any], Any]) -> bool:
        """Replace the framework method ``owner.name`` by ``wrap(original)`` until the hooks are
        uninstalled (for frameworks without a hook point where one is needed). The wrapper should
        do its work only while :attr:`active`. Returns False when ``owner`` defines no ``name``
        (a framework version that changed: say so with :meth:`warn`)."""
        original = owner.__dict__.get(name)
        if original is None:
            return False
        if getattr(original, "__agentbolt_hooks__", None) is self:
            return True  # ours is still in place, possibly under someone else's wrapper (functools.wraps)
        replacement = wrap(original)
        replacement.__agentbolt_hooks__ = self
        setattr(owner, name, replacement)
        self._patches.append((owner, name, original, replacement))
        return True

    def _unpatch(self) -> None:
        """Put back what :meth:`patch` replaced (unless someone replaced our wrapper since: theirs
        keeps calling ours, which passes through once inactive)."""
        while self._patches:
            owner, name, original, replacement = self._patches.pop()
            if owner.__dict__.get(name) is replacement:
                setattr(owner, name, original)

    def guard(self, what: str, exc: BaseException) -> None:
        """Count and log (once per kind) an error of the translation code; the framework never sees it."""
        self.recorder.guard(what, exc)

    def warn(
        self, kind: str, message: str, category: type[Warning] = UserWarning, *, level: int = logging.WARNING
    ) -> None:
        """A capture problem the user must act on: a warning each time (Python's filters show it
        once per place) and a log line at ``level`` once per ``kind``. Never raises, not even
        when warnings are turned into errors."""
        with contextlib.suppress(Exception):
            warnings.warn(message, category, stacklevel=3)
        if kind not in self._said:
            self._said.add(kind)
            log.log(level, "%s adapter: %s", self.adapter, message)


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
    framework reports from. Every public method swallows (and logs once per error type) any
    exception: the host framework never sees one.
    """

    def __init__(self, adapter: str) -> None:
        self.adapter = adapter
        self._open: dict[Hashable, _Open] = {}
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

    @never_raises("start")
    def start(self, key: Hashable, record: UnitRecord, *, parent_key: Hashable | None = None) -> None:
        """A unit began. Ignored outside rollouts (unless its parent belongs to one)."""
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
        renames it, for units whose name is known only at the end)."""
        with self._lock:
            unit = self._open.pop(key, None)
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

    def span_id_of(self, key: Hashable) -> str | None:
        """The span id given to an open unit (to link framework ids to spans)."""
        context = self.context_of(key)
        return None if context is None else context[1]

    def context_of(self, key: Hashable) -> tuple[str, str] | None:
        """(trace id, span id) of an open unit, e.g. to make it the OpenTelemetry parent of the
        framework's own spans."""
        with self._lock:
            unit = self._open.get(key)
        return None if unit is None else (unit.trace_id, unit.span_id)

    def discard_all(self) -> None:
        """Forget open units (at uninstrument)."""
        with self._lock:
            self._open.clear()


def _otel_parent() -> tuple[str | None, str | None]:
    ctx = otel_trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None, None
    return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")


def _clean(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """Keep OpenTelemetry-compatible values; JSON-encode structured ones instead of failing."""
    import json

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


def capture_span(adapters: Iterable[Adapter], failures: Iterable[str]) -> t.Span:
    """The ``agentbolt.capture`` span a runner records on each attempt: which adapters record it
    and which failed to instrument (``agentbolt doctor`` reports both)."""
    attrs = {
        semconv.SPAN_KIND_ATTR: "capture",
        semconv.CAPTURE_ADAPTERS: [str(a.name) for a in adapters],
        semconv.CAPTURE_ADAPTER_FAILURES: list(failures),
    }
    return t.Span.create(semconv.SPAN_CAPTURE, attributes=attrs)


def instrument_adapters(
    names: Iterable[str] | None = None, *, plugins: Any = None, failures: list[str] | None = None
) -> list[Adapter]:
    """Instrument installed adapter plugins; returns the ones now active.

    ``names=None`` instruments every registered adapter whose framework is installed (others
    are skipped quietly); a list instruments exactly those (an error if one is missing).
    Failures of individual adapters are logged, never raised, when ``names`` is ``None``, and
    appended to ``failures`` (as ``"name: why"``) when given: runners record them for ``agentbolt doctor``.
    """
    if plugins is None:
        from .plugins import default_plugins

        plugins = default_plugins()
    active: list[Adapter] = []
    wanted = None if names is None else list(names)
    for entry in plugins.adapters:
        if wanted is not None and entry.name not in wanted:
            continue
        try:
            adapter = entry.value()
            adapter.instrument()
            active.append(adapter)
        except MissingDependencyError as exc:
            if wanted is not None:
                raise
            log.debug("adapter %s not used: %s", entry.name, exc)
        except Exception as exc:
            if wanted is not None:
                raise
            log.warning("adapter %s could not be instrumented: %s", entry.name, exc)
            if failures is not None:
                failures.append(f"{entry.name}: {exc}")
    if wanted is not None:
        missing = set(wanted) - {a.name for a in active}
        if missing:
            raise UserError(f"adapters not registered: {sorted(missing)}; registered: {plugins.adapters.names()}")
    return active
