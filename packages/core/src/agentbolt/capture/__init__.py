"""Capture: what a rollout records besides the gateway's LLM calls.

- :mod:`~agentbolt.capture.tracing` — the rollout context (``contextvars``) and the OpenTelemetry
  span processor that routes spans to the rollout's store;
- :mod:`~agentbolt.capture.emit` — rewards, observations, messages and operations as spans
  (``emit_reward(1.0)``; the same names are exported by ``agentbolt``);
- :mod:`~agentbolt.capture.roles` — which agent made a call (:class:`AgentRoles`);
- :mod:`~agentbolt.capture.retokenize` — chat-template retokenizing for upstreams without token ids;
- :mod:`~agentbolt.capture.adapters` — the skeleton framework adapters are built on.

Names are imported on first use, so ``import agentbolt.capture`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from .emit import (
        NoRolloutWarning,
        emit_exception,
        emit_message,
        emit_object,
        emit_observation,
        emit_reward,
        operation,
    )
    from .retokenize import ChatTemplateRetokenizer
    from .roles import AgentNamer, AgentRoles
    from .tracing import RolloutContext, current_rollout, rollout_context

__all__ = [
    "AgentNamer",
    "AgentRoles",
    "ChatTemplateRetokenizer",
    "NoRolloutWarning",
    "RolloutContext",
    "current_rollout",
    "emit_exception",
    "emit_message",
    "emit_object",
    "emit_observation",
    "emit_reward",
    "operation",
    "rollout_context",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        **dict.fromkeys(
            [
                "NoRolloutWarning",
                "emit_exception",
                "emit_message",
                "emit_object",
                "emit_observation",
                "emit_reward",
                "operation",
            ],
            "emit",
        ),
        "ChatTemplateRetokenizer": "retokenize",
        "AgentNamer": "roles",
        "AgentRoles": "roles",
        "RolloutContext": "tracing",
        "current_rollout": "tracing",
        "rollout_context": "tracing",
    },
)
