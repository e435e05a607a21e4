"""The OpenAI Agents SDK adapter: a trace processor added next to the user's, translating SDK spans.

This module does not import ``agents``; :mod:`._processor` does, when the first instance is
instrumented. The processor is the adapter's :class:`~agentbolt.capture.adapters.AdapterHooks`: one per
process, recording while at least one instance is instrumented, so that the instances every
runner builds never record a unit twice.
"""

from __future__ import annotations

from typing import ClassVar

from agentbolt.capture.adapters import Adapter

from .errors import CaptureOffError, CaptureWarning

__all__ = ["CaptureOffError", "CaptureWarning", "OpenAIAgentsAdapter"]


class OpenAIAgentsAdapter(Adapter):
    """Records OpenAI Agents SDK runs inside rollouts as agentbolt spans.

    ``instrument()`` adds one trace processor with ``agents.tracing.add_trace_processor`` (the
    SDK's own processors and exporter, and the user's, keep receiving everything) and raises
    :class:`CaptureOffError` when tracing or sensitive-data capture is off for the whole process.
    It is idempotent, also across instances: all instances share one processor and one recorder.
    """

    name: ClassVar[str] = "openai-agents"
    distribution: ClassVar[str] = "openai-agents"
    supported: ClassVar[str] = ">=0.24,<0.25"
    hooks_class: ClassVar[str] = "._processor:AgentboltTraceProcessor"
