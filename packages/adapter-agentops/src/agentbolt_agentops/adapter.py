"""The AgentOps adapter: agents instrumented with AgentOps, under agentbolt.

AgentOps (``agentops.init()``, its ``@agent``/``@operation``/``@task``/``@tool``/``@workflow``
decorators, and its auto-instrumentation of LLM clients and agent frameworks) records work as
OpenTelemetry spans with ``agentops.span.kind``. What this adapter adds:

- **Coexistence.** ``agentops.init()`` sets its own global tracer provider. Before agentbolt's,
  core adds agentbolt's processor to it; after, AgentOps' provider joins agentbolt's (see
  :mod:`agentbolt.capture.tracing`). Either way AgentOps' processors and agentbolt both see every span.
- **Nothing leaves the machine without an API key.** Without one, AgentOps would still export
  spans and metrics to its cloud (where they are refused). Once this adapter was instrumented
  in a process, AgentOps' exporters aimed at ``agentops.ai`` send nothing while AgentOps has
  no API key (for the rest of the process: rollout spans AgentOps queued would otherwise be
  sent at exit). With an API key (``agentops.init(api_key=...)``, ``AGENTOPS_API_KEY``), or an
  exporter endpoint of the user's own, AgentOps exports as configured.
- **Structure.** AgentOps' spans become agentbolt units as they are stored:

  =================================  ==============================================================
  AgentOps span                      agentbolt unit
  =================================  ==============================================================
  ``agentops.span.kind=agent``       agent: ``gen_ai.agent.name`` from ``agent.name``, else the
                                     decorated name (``agentops.entity.name``, ``operation.name``)
  ``agentops.span.kind=tool``        tool call: name, arguments and result
  ``llm`` kind, or an LLM client     LLM call (its ``gen_ai.*`` attributes, response id included)
  span (``gen_ai.request.type``)
  session, workflow, task,           operation (nesting only)
  operation, other kinds
  =================================  ==============================================================

  LLM spans carry the provider's response id, which joins them to the gateway's span with the
  exact token ids; LLM requests to the gateway also carry the current span as ``traceparent``.

:class:`AgentOpsTracerAdapter` (opt-in) also initializes AgentOps in the runner when the agent's
code did not: the reference system's default tracer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from agentbolt.capture.adapters import Adapter

if TYPE_CHECKING:
    from ._hooks import AgentOpsHooks

__all__ = ["AgentOpsAdapter", "AgentOpsTracerAdapter"]


class AgentOpsAdapter(Adapter):
    """Reads AgentOps spans of rollouts as agents, LLM calls, tool calls and operations, and keeps
    AgentOps without an API key from reaching its cloud. See the module docstring."""

    name: ClassVar[str] = "agentops"
    distribution: ClassVar[str] = "agentops"
    supported: ClassVar[str] = ">=0.4.21,<0.5"

    @classmethod
    def make_hooks(cls) -> AgentOpsHooks:
        from ._hooks import AgentOpsHooks

        return AgentOpsHooks("agentops")


class AgentOpsTracerAdapter(AgentOpsAdapter):
    """AgentOps as the tracer of every rollout (opt-in: ``adapters=["agentops-tracer", ...]``).

    Besides what :class:`AgentOpsAdapter` does, ``instrument()`` initializes AgentOps when the
    process has not (``agentops.init(auto_start_session=False)``: no session span, LLM clients
    and the agent frameworks AgentOps knows instrumented), so agents that never mention AgentOps
    get its spans. AgentOps cannot be un-initialized: ``uninstrument()`` stops the translation,
    AgentOps' own instrumentation stays for the process (and keeps sending nothing to its cloud
    without an API key).
    """

    name: ClassVar[str] = "agentops-tracer"
    auto: ClassVar[bool] = False

    @classmethod
    def make_hooks(cls) -> AgentOpsHooks:
        from ._hooks import AgentOpsHooks

        return AgentOpsHooks("agentops", manage=True)
