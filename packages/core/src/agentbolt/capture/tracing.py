"""Rollout attribution and span capture.

While a runner executes an agent it sets a :class:`RolloutContext` in a ``contextvars``
variable, so many rollouts run concurrently in one process (asyncio tasks, or threads started
with ``asyncio.to_thread``/``contextvars.copy_context``) without their spans mixing.

Spans reach the store through a :class:`SpanSink`: agents and instrumentation only append to
an in-memory queue (thread-safe, never blocking); a task on the runner's event loop writes
batches to the store.

OpenTelemetry: :func:`install_otel` adds :class:`AgentboltSpanProcessor` to the process's SDK
``TracerProvider`` — the user's own if they already set one (their exporters keep working and
receive what they received before), otherwise a new provider that has only our processor, so
nothing goes anywhere else unless the user configures it. The processor keeps spans that start
inside a rollout (or under a span that did) and ignores all others.

Whoever sets the global provider first, both sides receive the spans: when agentbolt's own
provider is global and an instrumentation (AgentOps, Phoenix's ``register``, the user's code)
sets its provider later — which OpenTelemetry refuses — that provider *joins* ours instead:
spans made through the global API also reach its processors (its exporters receive what they
would have), and spans made through its own tracers reach agentbolt.

Span translators (:func:`add_span_translator`) map another instrumentation's conventions onto
agentbolt's (adapter packages for AgentOps, OpenInference, OpenLLMetry); they run when a
finished span is converted, on the runner's event loop, never on the agent's thread.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from .. import semconv
from .. import types as t
from .._tasks import cancel_and_wait
from ..errors import NotFoundError

__all__ = [
    "AgentboltSpanProcessor",
    "RolloutContext",
    "SpanSink",
    "SpanStarter",
    "SpanTranslator",
    "add_span_starter",
    "add_span_translator",
    "current_rollout",
    "install_otel",
    "remove_span_starter",
    "remove_span_translator",
    "rollout_context",
]

log = logging.getLogger(__name__)

_CURRENT: contextvars.ContextVar[RolloutContext | None] = contextvars.ContextVar("agentbolt_rollout", default=None)

SpanTranslator = Callable[["t.Span"], "t.Span | None"]
"""Maps a captured OpenTelemetry span (converted to a :class:`~agentbolt.types.Span`) onto
agentbolt's conventions: returns the span to store instead, or ``None`` to store it unchanged."""
SpanStarter = Callable[[Any], None]
"""Sees an OpenTelemetry SDK span of a rollout as it starts (still writable), on the thread that
started it: what must be known before the span ends (e.g. the agent a span belongs to, in case
its agent's span never ends). Must be cheap and must not raise (errors are logged)."""
F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class RolloutContext:
    """The rollout an agent is running for; visible to emitters through :func:`current_rollout`."""

    rollout_id: str
    """The rollout."""
    attempt_id: str
    """The attempt of the rollout being run."""
    sink: SpanSink | None = None
    """Where this rollout's spans go; ``None`` records nothing (e.g. a unit test of an agent)."""
    task_id: str | None = None
    """The task being run."""
    mode: t.RolloutMode = t.RolloutMode.TRAIN
    """Training or validation."""
    group_id: str | None = None
    """The rollout's group."""
    rewards: list[tuple[float, bool]] = field(default_factory=list)
    """Rewards emitted so far: (primary value, marked final)."""

    def record(self, span: t.Span) -> None:
        """Queue a span of this rollout (sets its rollout and attempt ids unless already set)."""
        if self.sink is None:
            return
        if span.rollout_id != self.rollout_id or span.attempt_id != self.attempt_id:
            span = span.model_copy(update={"rollout_id": self.rollout_id, "attempt_id": self.attempt_id})
        self.sink.put(span)

    @property
    def final_reward(self) -> float | None:
        """The last reward marked final, else the last reward emitted, else ``None``."""
        finals = [v for v, final in self.rewards if final]
        if finals:
            return finals[-1]
        return self.rewards[-1][0] if self.rewards else None


def current_rollout() -> RolloutContext | None:
    """The rollout the calling code runs in, or ``None`` outside any rollout."""
    return _CURRENT.get()


@contextmanager
def rollout_context(ctx: RolloutContext) -> Iterator[RolloutContext]:
    """Run the block as part of ``ctx``'s rollout."""
    token = _CURRENT.set(ctx)
    try:
        yield ctx
    finally:
        _CURRENT.reset(token)


class SpanSink:
    """Batches spans (agentbolt spans or finished OpenTelemetry spans) into the store.

    ``put`` may be called from any thread; writing happens on the event loop given to
    :meth:`start`. Call :meth:`flush` before reporting an attempt finished, so every span of
    the attempt is stored by the time the rollout is final.
    """

    def __init__(
        self, store: Any, *, batch_size: int = 500, interval_s: float = 0.05, max_queue: int = 200_000
    ) -> None:
        self.store = store
        self.batch_size = batch_size
        self.interval_s = interval_s
        self.max_queue = max_queue
        self._queue: collections.deque[Any] = collections.deque()
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wakeup: asyncio.Event | None = None
        self._urgent: asyncio.Event | None = None
        self._written_event: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._added = 0
        self._done = 0
        self.dropped = 0
        self.errors = 0

    def start(self) -> None:
        """Start the background writer on the running event loop."""
        self._loop = asyncio.get_running_loop()
        self._wakeup = asyncio.Event()
        self._urgent = asyncio.Event()
        self._written_event = asyncio.Event()
        self._task = self._loop.create_task(self._run(), name="agentbolt-span-sink")

    def put(self, span: Any) -> None:
        """Queue one span; never blocks. Thread-safe."""
        with self._lock:
            if len(self._queue) >= self.max_queue:
                self._queue.popleft()
                self.dropped += 1
                if self.dropped == 1 or self.dropped % 10_000 == 0:
                    log.error(
                        "span queue full (%d); dropping the oldest spans (the store is too slow?)", self.max_queue
                    )
            self._queue.append(span)
            self._added += 1
        loop, wakeup = self._loop, self._wakeup
        if loop is not None and wakeup is not None and not wakeup.is_set():
            try:
                if _on_loop(loop):
                    wakeup.set()
                else:
                    loop.call_soon_threadsafe(wakeup.set)
            except RuntimeError:  # loop closed
                pass

    async def flush(self, timeout: float | None = 30.0) -> None:
        """Wait until everything queued before this call is written (or dropped)."""
        target = self._added
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while self._done < target:
            if self._wakeup is None or self._written_event is None or self._urgent is None:
                raise RuntimeError("SpanSink.start() was not called")
            self._urgent.set()  # skip the batching delay: someone is waiting
            self._wakeup.set()
            self._written_event.clear()
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                raise TimeoutError(f"{target - self._done} spans not yet written to the store")
            try:
                await asyncio.wait_for(self._written_event.wait(), remaining)
            except TimeoutError:
                continue

    async def close(self, timeout: float = 30.0) -> None:
        """Write what is queued (waiting at most ``timeout``), then stop."""
        if self._task is None:
            return
        try:
            await self.flush(timeout=timeout)
        except TimeoutError as exc:
            log.error("closing the span sink: %s; they are lost", exc)
        await cancel_and_wait(self._task)
        self._task = None

    def _take(self) -> list[Any]:
        with self._lock:
            n = min(self.batch_size, len(self._queue))
            return [self._queue.popleft() for _ in range(n)]

    async def _run(self) -> None:
        assert self._wakeup is not None and self._written_event is not None and self._urgent is not None
        while True:
            if not self._queue and not self._awaited():
                await self._wakeup.wait()
                self._wakeup.clear()
            if self.interval_s > 0 and not self._urgent.is_set() and not self._awaited():  # let a batch build up
                try:
                    await asyncio.wait_for(self._urgent.wait(), self.interval_s)
                except TimeoutError:
                    pass
            self._urgent.clear()
            raw = self._take()
            if not raw and not self._awaited():
                continue
            spans = [s for s in map(_as_span, raw) if s is not None]
            self.dropped += len(raw) - len(spans) + await self._write(spans, self._done + len(raw))
            self._done += len(raw)
            self._written_event.set()

    def _awaited(self) -> bool:
        """Whether something besides queued spans is waited for (for subclasses): the writer then
        runs without the batching delay, even with no spans queued."""
        return False

    async def _write(self, spans: list[t.Span], upto: int) -> int:
        """Store a batch (``upto``: how many spans were queued up to its last one), retrying
        while the store fails; the batch is held and new spans queue up behind it. Returns how
        many spans were dropped (those of unknown rollouts)."""
        backoff = 0.5
        while spans:
            try:
                await self.store.add_spans(spans)
                return 0
            except NotFoundError as exc:
                log.warning("dropping %d spans for unknown rollouts: %s", len(spans), exc)
                return len(spans)
            except Exception as exc:
                self.errors += 1
                log.warning("writing %d spans failed (%s); retrying in %.1f s", len(spans), exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)
        return 0


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


@dataclass(frozen=True)
class _Finished:
    """A finished OpenTelemetry span with the translators active when it ended."""

    span: Any
    translators: tuple[SpanTranslator, ...]


def _as_span(item: Any) -> t.Span | None:
    if isinstance(item, t.Span):
        return item
    translators: tuple[SpanTranslator, ...] = ()
    if isinstance(item, _Finished):
        item, translators = item.span, item.translators
    try:  # a finished OpenTelemetry SDK span, converted off the agent's thread
        span = t.Span.from_otel(item)
    except Exception as exc:
        log.warning("dropping an OpenTelemetry span that cannot be converted: %s", exc)
        return None
    for translate in translators:
        try:
            span = translate(span) or span
        except Exception as exc:  # translators guard themselves; this is the last line of defence
            log.warning("a span translator failed on %r (%r); the span is stored untranslated", span.name, exc)
    return span


# ------------------------------------------------------------------------------------------------
# OpenTelemetry
# ------------------------------------------------------------------------------------------------


class _Callbacks(Generic[F]):
    """Callbacks in the order added, each once: read without a lock on every span (:attr:`all` is
    a tuple, replaced on each change), changed under one."""

    def __init__(self) -> None:
        self.all: tuple[F, ...] = ()
        self._lock = threading.Lock()

    def add(self, callback: F) -> None:
        """Add ``callback`` (once, however often added)."""
        with self._lock:
            if callback not in self.all:
                self.all = (*self.all, callback)

    def remove(self, callback: F) -> None:
        """Remove ``callback`` (a no-op when it is not there)."""
        with self._lock:
            self.all = tuple(c for c in self.all if c != callback)


def _span_processor_base() -> type:
    from opentelemetry.sdk.trace import SpanProcessor  # the SDK loads only when a runner installs capture

    return SpanProcessor


if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor as _SpanProcessorBase
else:
    _SpanProcessorBase = _span_processor_base()


class AgentboltSpanProcessor(_SpanProcessorBase):
    """An OpenTelemetry ``SpanProcessor`` routing spans of rollouts to their runner's sink.

    A span belongs to a rollout when it starts while a :class:`RolloutContext` is current, or
    under a parent span that did (e.g. in a thread the agent started). Its rollout and attempt
    ids are set as span attributes at start, so they survive any exporter. Other spans are left
    alone.
    """

    def __init__(self) -> None:
        self._open: dict[tuple[int, int], tuple[SpanSink, str, str]] = {}
        self.starters: _Callbacks[SpanStarter] = _Callbacks()
        """Called on the spans of rollouts as they start."""
        self.translators: _Callbacks[SpanTranslator] = _Callbacks()
        """Applied to the spans of rollouts as they end (spans that ended before a change keep
        the translators of their time)."""

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        ctx = _CURRENT.get()
        route: tuple[SpanSink, str, str] | None
        if ctx is not None and ctx.sink is not None:
            route = (ctx.sink, ctx.rollout_id, ctx.attempt_id)
        else:
            parent = _parent_span(parent_context)
            if parent is None:
                return
            pctx = parent.get_span_context()
            route = self._open.get((pctx.trace_id, pctx.span_id))
            if route is None:
                return
        span.set_attribute(semconv.ROLLOUT_ID, route[1])
        span.set_attribute(semconv.ATTEMPT_ID, route[2])
        sctx = span.get_span_context()
        self._open[(sctx.trace_id, sctx.span_id)] = route
        for start in self.starters.all:
            try:
                start(span)
            except Exception as exc:  # starters guard themselves; this is the last line of defence
                log.warning("a span starter failed on %r (%r)", getattr(span, "name", "?"), exc)

    def on_end(self, span: Any) -> None:
        sctx = span.get_span_context()
        route = self._open.pop((sctx.trace_id, sctx.span_id), None)
        if route is not None:
            translators = self.translators.all
            route[0].put(_Finished(span, translators) if translators else span)

    def shutdown(self) -> None:
        self._open.clear()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def _parent_span(parent_context: Any) -> Any:
    from opentelemetry import trace  # loaded with the SDK, on first use

    span = trace.get_current_span(parent_context)
    return span if span.get_span_context().is_valid else None


def install_otel(provider: Any = None) -> Any:
    """Make OpenTelemetry spans of rollouts reach the store; idempotent. Returns the provider.

    Uses the user's SDK ``TracerProvider`` when one is set, else sets one with only our
    processor (and from then on lets a provider set later join it: see the module docstring).
    A non-SDK provider cannot take processors: a warning says so and OpenTelemetry spans are
    then not captured (the gateway still records every LLM call).

    ``provider``: also capture the spans of this SDK provider (one an instrumentation was given
    explicitly without making it global, e.g. ``Instrumentor().instrument(tracer_provider=p)``
    before agentbolt started). Returns it.
    """
    from opentelemetry import trace  # OpenTelemetry's SDK loads here, in runners, not on import
    from opentelemetry.sdk.trace import TracerProvider

    glob = trace.get_tracer_provider()
    if not isinstance(glob, TracerProvider) and type(glob).__name__ in ("ProxyTracerProvider", "NoOpTracerProvider"):
        ours = TracerProvider()
        trace.set_tracer_provider(ours)
        glob = trace.get_tracer_provider()  # someone may have won the race
        if glob is ours:
            _let_later_providers_join(ours)
    if isinstance(glob, TracerProvider):
        processor = _processor_of(glob)
    else:
        processor = AgentboltSpanProcessor()
        log.warning(
            "the global OpenTelemetry TracerProvider (%s) is not the SDK's; spans made with the "
            "OpenTelemetry API inside rollouts will not be captured",
            type(glob).__name__,
        )
    if provider is None:
        return glob
    if provider is not glob:
        _attach(provider, processor)
    return provider


def _processor_of(provider: Any) -> AgentboltSpanProcessor:
    """The provider's agentbolt processor (added now if it has none)."""
    processor: AgentboltSpanProcessor | None = getattr(provider, "_agentbolt_processor", None)
    if processor is None:
        processor = AgentboltSpanProcessor()
        _attach(provider, processor)
    return processor


def _attach(provider: Any, processor: AgentboltSpanProcessor) -> None:
    if getattr(provider, "_agentbolt_processor", None) is None:
        provider.add_span_processor(processor)
        provider._agentbolt_processor = processor


def _let_later_providers_join(ours: Any) -> None:
    """agentbolt set the global provider: a provider set later joins it instead of being refused.

    OpenTelemetry lets the global provider be set once. An instrumentation that sets its own
    after agentbolt (``agentops.init()``, Phoenix's ``register()``, the user's code) would
    otherwise lose every span made through the global API to ours, and agentbolt every span made
    through its tracers. ``opentelemetry.trace.set_tracer_provider`` goes through the module's
    ``_set_tracer_provider``; it is wrapped (once per process) so that such a provider gets
    agentbolt's processor and ours forwards every span to its processors.
    """
    from opentelemetry import trace as api
    from opentelemetry.sdk.trace import TracerProvider

    original = api._set_tracer_provider
    if getattr(original, "__agentbolt__", False):
        return

    def set_tracer_provider(tracer_provider: Any, log: bool) -> None:  # OpenTelemetry's signature
        current = getattr(api, "_TRACER_PROVIDER", None)
        if current is ours and tracer_provider is not ours and isinstance(tracer_provider, TracerProvider):
            _join(ours, tracer_provider)
            return
        original(tracer_provider, log)

    set_tracer_provider.__agentbolt__ = True  # type: ignore[attr-defined]  # marks our wrapper: installing twice wraps once
    api._set_tracer_provider = set_tracer_provider


def _join(ours: Any, late: Any) -> None:
    if getattr(late, "_agentbolt_joined", False):
        return
    late._agentbolt_joined = True
    processors = getattr(late, "_active_span_processor", None)
    if processors is None:  # a future SDK without this attribute: say what is lost
        log.warning(
            "a TracerProvider set after agentbolt's cannot join it; spans made with the global "
            "OpenTelemetry API reach agentbolt, not that provider's exporters"
        )
    else:
        ours.add_span_processor(processors)
    _attach(late, _processor_of(ours))
    log.info(
        "a TracerProvider was set after agentbolt's (%s): it joins agentbolt's global provider, so its "
        "exporters receive the spans made through the global API and agentbolt receives its spans",
        type(late).__module__,
    )


def _installed_processor() -> AgentboltSpanProcessor | None:
    """The global provider's agentbolt processor, after installing the capture (:func:`install_otel`);
    ``None`` when the global provider is not the SDK's (nothing is captured)."""
    from opentelemetry.sdk.trace import TracerProvider

    provider = install_otel()
    return _processor_of(provider) if isinstance(provider, TracerProvider) else None


def _current_processor() -> AgentboltSpanProcessor | None:
    """The global provider's agentbolt processor, if the capture was installed (installs nothing)."""
    from opentelemetry import trace

    return getattr(trace.get_tracer_provider(), "_agentbolt_processor", None)


def add_span_translator(translate: SpanTranslator) -> bool:
    """Translate the OpenTelemetry spans of rollouts with ``translate`` (see :data:`SpanTranslator`)
    from now on, once however often added; installs the capture first (:func:`install_otel`).
    Returns False when the global provider is not the SDK's (nothing is captured to translate)."""
    processor = _installed_processor()
    if processor is not None:
        processor.translators.add(translate)
    return processor is not None


def add_span_starter(start: SpanStarter) -> bool:
    """Call ``start`` on every OpenTelemetry span of a rollout as it starts (see :data:`SpanStarter`),
    once however often added; installs the capture first. False when the global provider is not
    the SDK's."""
    processor = _installed_processor()
    if processor is not None:
        processor.starters.add(start)
    return processor is not None


def remove_span_starter(start: SpanStarter) -> None:
    """Stop calling ``start`` (a no-op when it was not added)."""
    processor = _current_processor()
    if processor is not None:
        processor.starters.remove(start)


def remove_span_translator(translate: SpanTranslator) -> None:
    """Stop translating with ``translate`` (a no-op when it was not added; spans that ended before
    keep it)."""
    processor = _current_processor()
    if processor is not None:
        processor.translators.remove(translate)
