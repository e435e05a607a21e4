"""agentbolt: train any AI agent with reinforcement learning, with almost zero change to the agent.

The names most programs need are here (the option groups ``RunnerOptions``, ``GatewayOptions``
and ``CaptureOptions`` of :mod:`agentbolt.options` too)::

    from agentbolt import Trainer, emit_reward

    def agent(task, resources):
        ...                      # call resources.llm.base_url with any OpenAI client
        emit_reward(1.0)         # or return the reward

    Trainer(agent, algorithm="torch-grpo").fit(train, val)

Each is imported on first use, so ``import agentbolt`` stays cheap. The parts: ``agentbolt.capture``
(tracing, emitters, roles, adapters), ``agentbolt.gateway``, ``agentbolt.store`` (and its server),
``agentbolt.runners``, ``agentbolt.lightningrl``, ``agentbolt.runs``, ``agentbolt.plugins``,
``agentbolt.cli``, ``agentbolt.testing``.
"""

from __future__ import annotations

import importlib.metadata
from typing import TYPE_CHECKING

from ._lazy import lazy_exports
from .plugins.hookspecs import hookimpl

if TYPE_CHECKING:
    from .algorithm import Algorithm, AlgorithmContext
    from .capture.emit import (
        emit_exception,
        emit_message,
        emit_object,
        emit_observation,
        emit_reward,
        operation,
    )
    from .capture.roles import AgentRoles
    from .lightningrl.config import LightningRLConfig
    from .options import CaptureOptions, GatewayOptions, RunnerOptions, RunOptions
    from .store import Store, open_store
    from .trainer import Trainer
    from .types import LLMEndpoint, Resources, Rollout, Span, Task, Transition

try:
    __version__ = importlib.metadata.version("agentbolt")
except importlib.metadata.PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0+unknown"

__all__ = [
    "AgentRoles",
    "Algorithm",
    "AlgorithmContext",
    "CaptureOptions",
    "GatewayOptions",
    "LLMEndpoint",
    "LightningRLConfig",
    "Resources",
    "Rollout",
    "RunOptions",
    "RunnerOptions",
    "Span",
    "Store",
    "Task",
    "Trainer",
    "Transition",
    "__version__",
    "emit_exception",
    "emit_message",
    "emit_object",
    "emit_observation",
    "emit_reward",
    "hookimpl",
    "open_store",
    "operation",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "Trainer": "trainer",
        "Algorithm": "algorithm",
        "AlgorithmContext": "algorithm",
        **dict.fromkeys(
            ["emit_exception", "emit_message", "emit_object", "emit_observation", "emit_reward", "operation"],
            "capture.emit",
        ),
        "AgentRoles": "capture.roles",
        "LightningRLConfig": "lightningrl.config",
        **dict.fromkeys(["CaptureOptions", "GatewayOptions", "RunOptions", "RunnerOptions"], "options"),
        "Store": "store",
        "open_store": "store",
        **dict.fromkeys(["LLMEndpoint", "Resources", "Rollout", "Span", "Task", "Transition"], "types"),
    },
)
