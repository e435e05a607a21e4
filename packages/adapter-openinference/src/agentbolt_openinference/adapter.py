"""The OpenInference adapter: the spans of OpenInference instrumentors, read as agentbolt structure.

OpenInference instrumentors (``openinference-instrumentation-smolagents``, ``-openai``,
``-crewai``, ``-langchain``, ``-llama-index``, ``-dspy``...) record each unit of work as an
OpenTelemetry span with ``openinference.span.kind``. Core captures every span started inside a
rollout whoever set the tracer provider (the user's exporter — Phoenix, a collector — keeps
receiving them); this adapter maps them onto agentbolt's conventions as they are stored:

======================  ===========================================================================
OpenInference kind      agentbolt unit
======================  ===========================================================================
``AGENT``               agent: ``gen_ai.agent.name`` from ``agent.name``, else the span name
                        (smolagents names its agent spans ``{agent name}.run``)
``LLM``                 LLM call: ``gen_ai.request.model``, usage, ``gen_ai.output.messages`` (with
                        tool calls) and, when the output holds it, ``gen_ai.response.id``
``TOOL``                tool call: ``gen_ai.tool.name``, arguments, result, call id
``CHAIN`` and others    operation (nesting only)
======================  ===========================================================================

The instrumentation's span ids, parents, times and status are kept, so the tree LightningRL
walks is the instrumentation's own. LLM requests sent to the gateway carry the current span as
W3C ``traceparent``, so the gateway's span with the exact token ids is a child of the
instrumentation's LLM span: LightningRL joins them even when OpenInference recorded no response
id (smolagents' model spans), and each transition gets the name of its nearest agent.
"""

from __future__ import annotations

from typing import ClassVar

from agentbolt.capture.adapters import Adapter

__all__ = ["OpenInferenceAdapter"]


class OpenInferenceAdapter(Adapter):
    """Reads OpenInference spans of rollouts as agents, LLM calls, tool calls and operations.

    See the module docstring for the mapping.
    """

    name: ClassVar[str] = "openinference"
    distribution: ClassVar[str] = "openinference-semantic-conventions"
    supported: ClassVar[str] = ">=0.1.20,<0.2"
    hooks_class: ClassVar[str] = "._hooks:OpenInferenceHooks"
