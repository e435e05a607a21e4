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
                  options, hooks_class (the hooks class, imported on first instrument)
    _hooks.py     (or _handler.py, _processor.py) the AdapterHooks subclass: the framework
                  translation; it and the private modules it uses are the only ones that
                  import the framework
    errors.py     the package's warnings and errors, when it has any
    __init__.py   the public names and ``__version__``; ``py.typed``

What they share lives here, one module per concern: the lifecycle (:mod:`.lifecycle`:
:class:`Adapter`, version check, install once per process, idempotent instrument/uninstrument),
the hooks' state, guards and patched methods (:mod:`.hooks`: :class:`AdapterHooks`), the span
building (:mod:`.recorder`: :class:`SpanRecorder`, :func:`never_raises`), the field
conversions (:mod:`.attributes`: timestamps, tool calls, usage, chat completions, bounded text)
the join of tool spans to the LLM outputs that requested them (:mod:`.tool_calls`), and, for
adapters whose framework is another instrumentation's OpenTelemetry spans (AgentOps,
OpenInference, OpenLLMetry), span translation (:mod:`.otel_spans`: :class:`OtelSpanHooks`) and
trace context from the agent's LLM requests to the gateway (:mod:`.propagation`).
Attribute names come from :mod:`agentbolt.semconv`; framework-specific ones are spelt in the
framework's namespace (``autogen.*``, ``langgraph.*``, ``openai_agents.*``) in the hooks module.
"""

from __future__ import annotations

from .attributes import (
    call_arguments,
    chat_completion_attributes,
    request_attributes,
    text_attribute,
    tool_call,
    unix_ns,
    usage_attributes,
)
from .hooks import AdapterHooks
from .lifecycle import Adapter, capture_span, check_distribution, instrument_adapters
from .otel_spans import OtelSpanHooks, first_attribute
from .propagation import propagate_to_gateway, traceparent_for
from .recorder import SpanRecorder, UnitRecord, in_rollout, never_raises
from .tool_calls import ToolCall, ToolCallRequests, tool_calls_of

__all__ = [
    "Adapter",
    "AdapterHooks",
    "OtelSpanHooks",
    "SpanRecorder",
    "ToolCall",
    "ToolCallRequests",
    "UnitRecord",
    "call_arguments",
    "capture_span",
    "chat_completion_attributes",
    "check_distribution",
    "first_attribute",
    "in_rollout",
    "instrument_adapters",
    "never_raises",
    "propagate_to_gateway",
    "request_attributes",
    "text_attribute",
    "tool_call",
    "tool_calls_of",
    "traceparent_for",
    "unix_ns",
    "usage_attributes",
]
