"""The AutoGen AgentChat adapter: AutoGen's own telemetry, completed and routed to rollouts.

What AutoGen 0.7 reports, and what this adapter does with it:

- **Agents and tools: AutoGen's OpenTelemetry spans, enriched in place.** ``autogen-core``
  starts ``invoke_agent {name}`` spans (``BaseChatAgent.run``/``run_stream`` and every turn of
  an agent inside a team) and ``execute_tool {name}`` spans (``BaseTool.run_json``, with
  ``gen_ai.tool.name``, ``gen_ai.tool.call.id`` and, when the tool raises, status ERROR, an
  ``exception`` event and ``error.type``). Core's OpenTelemetry capture already stores spans
  started inside a rollout; a span processor added here marks AutoGen's agent and tool spans
  of rollouts as adapter spans (``agentbolt.adapter``, ``agentbolt.span.kind``) and adds the
  tool call's arguments. Nothing is recorded twice. ``create_agent`` spans (agent
  construction, which encloses no work) are stored as they are, unmarked.
- **LLM calls: AutoGen's structured events, as spans.** Model clients log an ``LLMCallEvent``
  (``LLMStreamStartEvent``/``LLMStreamEndEvent`` for streams) on ``autogen_core.events``, with
  the raw response. It becomes an LLM span under the agent span current when AutoGen logged it,
  carrying ``gen_ai.response.id`` = the OpenAI response id (LightningRL joins the gateway's span
  with exact token ids through it), the finish reasons, usage and the output message.
- **Teams** (``BaseGroupChat`` and subclasses: round robin, selector, swarm, graph, Magentic-One)
  emit no span of their own: the adapter records one per run (``invoke_agent {team name}``,
  keyed by the team's id) and makes it the OpenTelemetry parent of the run, so the team's
  runtime spans and its agents' turns form one tree in one trace instead of a trace per queued
  message.
- **Messages**: every chat message and agent event of a team run (``TextMessage``,
  ``ToolCallRequestEvent``, ``HandoffMessage``...) and the tool-call request/execution events an
  ``AssistantAgent`` logs on ``autogen_agentchat.events`` become message spans keyed by
  AutoGen's message id, timed by the message's ``created_at``.

Every unit goes to the rollout current where AutoGen reported it (``contextvars``; AutoGen's
tasks inherit the caller's context), so concurrent rollouts never mix. Nothing here raises into
AutoGen: each hook is guarded and errors are logged once per kind.

The hooks (:mod:`._hooks`: a logging filter, a span processor, one patched method) are
process-wide, installed while at least one :class:`AutogenAdapter` is instrumented and shared by
every instance (:class:`~agentbolt.capture.adapters.AdapterHooks`), so two instances never record a unit
twice.
"""

from __future__ import annotations

from typing import ClassVar

from agentbolt.capture.adapters import Adapter

from .errors import AutogenCaptureWarning

__all__ = ["AutogenAdapter", "AutogenCaptureWarning"]


class AutogenAdapter(Adapter):
    """Records AutoGen AgentChat runs (agents, teams, LLM calls, tool calls, messages) as spans.

    See the module docstring for what is captured and from which AutoGen mechanism.
    """

    name: ClassVar[str] = "autogen"
    distribution: ClassVar[str] = "autogen-agentchat"
    supported: ClassVar[str] = ">=0.7,<0.8"
    hooks_class: ClassVar[str] = "._hooks:AutogenHooks"
