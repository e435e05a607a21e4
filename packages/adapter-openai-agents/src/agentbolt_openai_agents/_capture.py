"""Whether the Agents SDK is set up so that the adapter can capture anything useful: the
process-wide checks run at every ``instrument()`` and the warnings for single runs that record
less than training needs (imports ``agents``)."""

from __future__ import annotations

import os

from agents import RunConfig
from agents.tracing import get_trace_provider
from agents.tracing.traces import NoOpTrace

from .errors import CaptureOffError

SENSITIVE_DATA = "openai_agents.trace_include_sensitive_data"
"""``False`` on LLM spans of runs whose ``RunConfig`` excluded sensitive data."""

ENV_DISABLE = "OPENAI_AGENTS_DISABLE_TRACING"
ENV_SENSITIVE = "OPENAI_AGENTS_TRACE_INCLUDE_SENSITIVE_DATA"


_WHY_LOCAL = (
    "agentbolt's spans go only to the agentbolt store. To keep the SDK's own traces from being "
    "exported to OpenAI, remove its default exporter with agents.tracing.set_trace_processors([]) "
    "before the runner starts, not by disabling tracing"
)


def check_capture_settings() -> None:
    """Raise :class:`CaptureOffError` when the process-wide SDK settings make spans useless."""
    value = os.environ.get(ENV_DISABLE)
    if value is not None and value.lower() in ("true", "1"):  # the SDK's own parsing
        raise CaptureOffError(
            f"the OpenAI Agents SDK's tracing is disabled ({ENV_DISABLE}={value}), and the agentbolt "
            f"openai-agents adapter sees agents, tools and handoffs only through it: unset {ENV_DISABLE} "
            f"in the processes that run agents for training. {_WHY_LOCAL}."
        )
    if isinstance(get_trace_provider().create_trace("agentbolt capture check"), NoOpTrace):
        raise CaptureOffError(
            "the OpenAI Agents SDK's tracing is disabled (agents.set_tracing_disabled(True), or a trace "
            "provider that creates no traces), and the agentbolt openai-agents adapter sees agents, tools "
            "and handoffs only through it: call agents.set_tracing_disabled(False) before the runner "
            f"starts. {_WHY_LOCAL}."
        )
    if not RunConfig().trace_include_sensitive_data:
        raise CaptureOffError(
            f"{ENV_SENSITIVE}={os.environ.get(ENV_SENSITIVE)} makes the OpenAI Agents SDK leave LLM outputs "
            "and tool arguments and results out of its spans, so the agentbolt openai-agents adapter would "
            f"record empty spans: unset {ENV_SENSITIVE} (or set it to true) in the processes that run agents "
            f"for training. {_WHY_LOCAL}."
        )


RUN_WARNINGS = {
    "run_tracing_disabled": (
        "an OpenAI Agents SDK run inside an agentbolt rollout has tracing disabled "
        "(RunConfig(tracing_disabled=True)): agentbolt records no agent, tool or handoff spans for it, so its "
        "LLM calls carry no agent names. Drop tracing_disabled from the RunConfig of the runs you train on."
    ),
    "run_no_sensitive_data": (
        "an OpenAI Agents SDK run inside an agentbolt rollout excludes sensitive data "
        "(RunConfig(trace_include_sensitive_data=False)): its spans lack LLM outputs and tool arguments and "
        "results, so agentbolt records structure only (agents, tool names, response ids) and marks its LLM spans "
        f"{SENSITIVE_DATA}=false. Set trace_include_sensitive_data=True for the runs you train on. {_WHY_LOCAL}."
    ),
    "tracing_disabled": (
        "the OpenAI Agents SDK's tracing was disabled after the agentbolt openai-agents adapter was instrumented "
        "(agents.set_tracing_disabled(True)): agentbolt records no agent, tool or handoff spans. "
        "Keep tracing enabled in the processes that run agents for training."
    ),
    "processor_missing": (
        "agentbolt's trace processor did not see the span of an OpenAI Agents SDK LLM call inside a rollout: "
        "it was removed (agents.tracing.set_trace_processors replaces every processor; use "
        "add_trace_processor) or the SDK's trace provider was replaced after the adapter was instrumented. "
        "Re-instrument the adapter after changing the SDK's processors."
    ),
    "no_response_id_hook": (
        "this openai-agents version has no OpenAIChatCompletionsModel._fetch_response(..., span, tracing, stream): "
        "the agentbolt adapter cannot read Chat Completions response ids, so LLM spans will not join the "
        "gateway's calls. Install a supported openai-agents version."
    ),
}
