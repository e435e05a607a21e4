"""Hooks of adapters whose framework is another instrumentation's OpenTelemetry spans
(:class:`OtelSpanHooks`): AgentOps, OpenInference, OpenLLMetry.

Such instrumentations already record agents, tools and LLM calls as OpenTelemetry spans, with
conventions of their own. Core captures every span started inside a rollout
(:mod:`agentbolt.capture.tracing`), whoever set the tracer provider; these hooks add, while installed:

- a **span translator**: each captured span the instrumentation made (and no other adapter
  marked) is mapped by
  :meth:`OtelSpanHooks.map_span` to a :class:`~agentbolt.capture.adapters.UnitRecord` (kind, name,
  GenAI attributes) and stored as that adapter unit, its own attributes kept, its ids, parent,
  times and status unchanged (the tree is the instrumentation's own);
- **trace context to the gateway** (:func:`~agentbolt.capture.adapters.propagation.propagate_to_gateway`):
  the gateway's LLM-call span becomes a child of the instrumentation's LLM span, which joins the
  two even when the instrumentation recorded no response id.
"""

from __future__ import annotations

import abc
from typing import Any

from ... import semconv
from ... import types as t
from ..tracing import add_span_starter, add_span_translator, remove_span_starter, remove_span_translator
from .hooks import AdapterHooks
from .propagation import propagate_to_gateway
from .recorder import UnitRecord

__all__ = ["OtelSpanHooks", "first_attribute"]


class OtelSpanHooks(AdapterHooks):
    """Translate another instrumentation's OpenTelemetry spans of rollouts into adapter units.

    Subclasses implement :meth:`map_span` (and may extend :meth:`install`/:meth:`uninstall`,
    calling these). The translation runs on the runner's event loop, when the finished span is
    converted, never on the agent's thread; an error in it is counted and logged once, and the
    span is stored untranslated.
    """

    @abc.abstractmethod
    def map_span(self, span: t.Span) -> UnitRecord | None:
        """The unit ``span`` stands for, or ``None`` when it is not this instrumentation's (or
        carries nothing agentbolt reads). ``UnitRecord.name`` empty keeps the span's name."""

    def install(self) -> None:
        if not add_span_translator(self.translate):
            self.warn(
                "provider",
                f"the global OpenTelemetry TracerProvider is not the SDK's: {self.adapter} spans are not captured",
            )
        add_span_starter(self.start)
        propagate_to_gateway(self)

    def uninstall(self) -> None:
        remove_span_translator(self.translate)
        remove_span_starter(self.start)

    def on_span_start(self, span: Any) -> None:
        """An OpenTelemetry SDK span of a rollout started (writable; on the agent's thread):
        what must be noted before it ends. Keep it cheap."""

    def start(self, span: Any) -> None:
        """The :data:`~agentbolt.capture.tracing.SpanStarter` these hooks add."""
        if not self.active:
            return
        try:
            self.on_span_start(span)
        except Exception as exc:
            self.guard("reading a starting span", exc)

    def translate(self, span: t.Span) -> t.Span | None:
        """The :data:`~agentbolt.capture.tracing.SpanTranslator` these hooks add."""
        if not self.active or semconv.ADAPTER in span.attributes:
            return None  # another adapter's unit (e.g. AutoGen marks its own OpenTelemetry spans)
        try:
            record = self.map_span(span)
        except Exception as exc:
            self.guard("mapping a span", exc)
            return None
        return None if record is None else self.recorder.translate(span, record)


def first_attribute(span: t.Span, *keys: str) -> Any:
    """The first of the span's attributes ``keys`` that is set and not empty, else ``None``."""
    for key in keys:
        value = span.attributes.get(key)
        if value is not None and value != "":
            return value
    return None
