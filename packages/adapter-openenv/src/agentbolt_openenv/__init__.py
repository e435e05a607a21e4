"""agentbolt-openenv: train agents on OpenEnv environment servers.

    from agentbolt import Trainer
    from agentbolt_openenv import OpenEnvAgent, seed_tasks

    agent = OpenEnvAgent("http://127.0.0.1:8000", max_turns=6)   # the default ReAct-style loop
    Trainer(agent, "torch-grpo", ...).fit(seed_tasks(range(1000)), seed_tasks(range(1000, 1100)))

Each rollout has its own session on the server (one WebSocket, one environment instance),
reset with the task's arguments; the agent loop calls the model through agentbolt's gateway;
the environment's rewards become agentbolt rewards (:data:`RewardRule`). docs/openenv.md has
the mapping and what is not supported.
"""

from __future__ import annotations

from .agent import OpenEnvAgent, check_server
from .errors import OpenEnvActionError, OpenEnvServerError, OpenEnvStepError
from .loop import DEFAULT_SYSTEM_PROMPT, ActionParseError, EpisodeLoop, ReActLoop, parse_tagged_action
from .session import EnvStep, OpenEnvSession, RewardRule, open_session
from .tasks import reset_kwargs, seed_tasks, server_tasks

__all__ = [
    "DEFAULT_SYSTEM_PROMPT",
    "ActionParseError",
    "EnvStep",
    "EpisodeLoop",
    "OpenEnvActionError",
    "OpenEnvAgent",
    "OpenEnvServerError",
    "OpenEnvSession",
    "OpenEnvStepError",
    "ReActLoop",
    "RewardRule",
    "check_server",
    "open_session",
    "parse_tagged_action",
    "reset_kwargs",
    "seed_tasks",
    "server_tasks",
]
