"""The binding's verl agent loop: each verl session runs as an agentbolt rollout.

verl instantiates :class:`AgentboltAgentLoop` in its ``AgentLoopWorker`` actors (registered
through ``agent_loops.yaml`` = ``actor_rollout_ref.rollout.agent.agent_loop_config_path``) and
awaits :meth:`AgentboltAgentLoop.run` once per session. The loop does not generate: agentbolt
runners run the user's agent, whose OpenAI calls go through the gateway to verl's vLLM
replicas. ``run`` returns one ``AgentLoopOutput`` per LLM call (transition), which verl's V1
trainer stores as rows ``{uid}_{session}_{index}``.
"""

from __future__ import annotations

import threading
from typing import Any

from .._verl import import_verl
from .rollouts import RolloutExecutor, RolloutRequest, executor_from_settings

import_verl("verl.experimental.agent_loop.agent_loop")

from verl.experimental.agent_loop.agent_loop import (  # noqa: E402
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
)

__all__ = ["AgentboltAgentLoop"]

_executors: dict[str, RolloutExecutor] = {}
_executors_lock = threading.Lock()


def shared_executor(config: Any) -> RolloutExecutor:
    """The process's executor for a composed verl config (one store connection per process)."""
    from ..config import settings_from_verl_config

    settings = settings_from_verl_config(config)
    key = settings.model_dump_json()
    with _executors_lock:
        executor = _executors.get(key)
        if executor is None:
            rollout = config.actor_rollout_ref.rollout
            correction = config.algorithm.get("rollout_correction", None) or {}
            need_logprobs = bool(rollout.calculate_log_probs) or bool(correction.get("bypass_mode", False))
            sink = None
            import ray

            if ray.is_initialized():
                from .ray_sink import RayMetricsSink

                sink = RayMetricsSink()
            executor = executor_from_settings(settings, calculate_log_probs=need_logprobs, sink=sink)
            _executors[key] = executor
    return executor


class AgentboltAgentLoop(AgentLoopBase):
    """verl ``AgentLoopBase`` that hands each session to agentbolt (see the module docstring).

    ``executor`` is for tests; verl's workers build one per process from the config's
    ``agentbolt`` section.
    """

    def __init__(self, *args: Any, executor: RolloutExecutor | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._executor = executor

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> list[AgentLoopOutput]:  # type: ignore[override]  # verl's V1 trainer takes a list: one row per item
        request = RolloutRequest.from_verl_row(kwargs, sampling_params)
        executor = self._executor or shared_executor(self.config)
        result = await executor.run(request)
        metrics = AgentLoopMetrics(generate_sequences=result.duration_s)
        return [AgentLoopOutput(**fields, metrics=metrics) for fields in result.outputs]
