"""The OpenLLMetry adapter: the spans of the Traceloop SDK and OpenLLMetry's instrumentations,
read as agentbolt structure.

OpenLLMetry records workflows, tasks, agents and tools (``@workflow``, ``@task``, ``@agent``,
``@tool`` of ``traceloop-sdk``, and its framework instrumentations: CrewAI, LangChain,
LlamaIndex, Agno, Haystack...) as spans with ``traceloop.span.kind`` and
``traceloop.entity.*``, and every LLM call (OpenAI, Anthropic, Bedrock, LiteLLM...) as a
span with the OpenTelemetry GenAI attributes (``gen_ai.operation.name``, ``gen_ai.response.id``,
``gen_ai.agent.name``...). Core captures every span started inside a rollout, whoever set the
tracer provider (``Traceloop.init`` adopts agentbolt's when it came first, and the user's
exporter keeps receiving everything); this adapter maps them onto agentbolt's conventions as
they are stored:

============================  =====================================================================
OpenLLMetry span              agentbolt unit
============================  =====================================================================
``traceloop.span.kind=agent``  agent: ``gen_ai.agent.name`` (else ``traceloop.entity.name``)
``traceloop.span.kind=tool``   tool call: ``gen_ai.tool.name``, arguments and result from
                              ``traceloop.entity.input``/``output``
``workflow``, ``task``         operation (nesting only)
an LLM call                    LLM call (``gen_ai.operation.name`` chat/text completion, or the
                              older ``llm.request.type``): its GenAI attributes as they are
============================  =====================================================================

The instrumentation's span ids, parents, times and status are kept. LLM spans carry the
provider's response id, which joins them to the gateway's span with the exact token ids; LLM
requests sent to the gateway also carry the current span as W3C ``traceparent``.
"""

from __future__ import annotations

from typing import ClassVar

from agentbolt.capture.adapters import Adapter

__all__ = ["OpenLLMetryAdapter"]


class OpenLLMetryAdapter(Adapter):
    """Reads OpenLLMetry spans of rollouts as agents, LLM calls, tool calls and operations.

    See the module docstring for the mapping.
    """

    name: ClassVar[str] = "openllmetry"
    distribution: ClassVar[str] = "opentelemetry-semantic-conventions-ai"
    supported: ClassVar[str] = ">=0.4.13,<0.6"
    hooks_class: ClassVar[str] = "._hooks:OpenLLMetryHooks"
