"""An agentbolt agent and its tasks as a verifiers environment, for ``vf-eval`` and the trainers
that read verifiers environments (prime-rl, ...).

A verifiers environment package exports its taskset (and may export a harness and an env) in
``__all__``; :func:`export_environment` builds all three from an agentbolt agent and its tasks::

    # calc_env/__init__.py, an installed package (or a module on sys.path)
    from agentbolt_verifiers import export_environment
    from my_agents import calc_agent, TASKS

    CalcTaskset, CalcHarness, CalcEnv = export_environment(calc_agent, TASKS, name="Calc")
    __all__ = ["CalcTaskset", "CalcHarness", "CalcEnv"]

    # then: vf-eval calc-env -n 5 --model qwen --client.base-url http://127.0.0.1:8000/v1

The mapping, the other way round from :mod:`.environment`:

- **tasks → taskset**: each agentbolt task is one verifiers task; its ``TaskData`` keeps the
  task's input (``input``) and id (``id``), and its prompt is the input as text.
- **agent → harness**: the harness runs the agent in the verifiers process with
  ``resources.llm`` on verifiers' interception endpoint (the base URL and key it hands every
  harness), so verifiers records each model call in its trace.
- **returned reward → rubric**: the task's one ``@vf.reward``, ``agent_reward``, is the reward
  the agent returned. An agent that returns ``None`` (it only emitted rewards inside an agentbolt
  rollout) has no reward outside one: the trace records that error.
- **env**: one seat, ``agent``, in the ``subprocess`` runtime by default (the harness runs in
  the verifiers process itself; no container is needed).
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import verifiers.v1 as vf
from verifiers.v1.runtimes import SubprocessConfig

from agentbolt import types as t
from agentbolt.algorithm import as_tasks
from agentbolt.errors import UserError
from agentbolt.reward_validation import reward_number
from agentbolt.runners.runner import load_agent

__all__ = [
    "AgentboltEnv",
    "AgentboltEnvConfig",
    "AgentboltHarness",
    "AgentboltTask",
    "AgentboltTaskData",
    "AgentboltTaskset",
    "ExportedEnvironment",
    "export_environment",
]

REWARD_INFO_KEY = "agentbolt_reward"
"""Where the harness leaves the agent's returned reward on the trace (``trace.info``)."""


class AgentboltTaskData(vf.TaskData):
    """One agentbolt task as verifiers task data: its input and (in ``id``) its task id."""

    input: Any = None
    """The agentbolt task's input (any JSON), handed to the agent unchanged."""


class AgentboltTask(vf.Task[AgentboltTaskData]):
    """An agentbolt task; its reward is the one the agent returned."""

    @vf.reward(weight=1.0)
    async def agent_reward(self, trace: vf.Trace) -> float:
        if REWARD_INFO_KEY not in trace.info:
            raise ValueError(
                "the agentbolt agent returned no reward: outside an agentbolt rollout its emitted rewards "
                "go nowhere, so an exported agent must return its reward"
            )
        return float(trace.info[REWARD_INFO_KEY])


class AgentboltTaskset(vf.Taskset[AgentboltTask, vf.TasksetConfig]):
    """The tasks an export was given (set on the subclass :func:`export_environment` makes)."""

    agentbolt_tasks: tuple[t.Task, ...] = ()

    def load(self) -> list[AgentboltTask]:
        out = []
        for task in self.agentbolt_tasks:
            prompt = task.input if isinstance(task.input, str) else json.dumps(task.input)
            out.append(
                AgentboltTask(AgentboltTaskData(id=task.task_id, prompt=prompt, input=task.input), self.config.task)
            )
        return out


class AgentboltHarnessConfig(vf.HarnessConfig):
    """No knobs: the harness runs the agent it was exported with."""


class AgentboltHarness(vf.Harness[AgentboltHarnessConfig]):
    """Runs an agentbolt agent in this process, its model calls on verifiers' interception."""

    APPENDS_SYSTEM_PROMPT = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    agentbolt_agent: Callable[[Any, t.Resources], Any] | None = None

    async def launch(
        self,
        ctx: vf.ModelContext,
        trace: vf.Trace,
        runtime: vf.Runtime,
        endpoint: str,
        secret: str,
        mcp_urls: dict[str, str],
        data: vf.TaskData,
    ) -> vf.ProgramResult:
        agent = type(self).agentbolt_agent
        if agent is None:
            raise vf.HarnessError(
                "AgentboltHarness runs no agent: build it with agentbolt_verifiers.export_environment"
            )
        sampling = {k: v for k, v in ctx.sampling.model_dump().items() if v is not None}
        resources = t.Resources(
            llm=t.LLMEndpoint(base_url=endpoint, model=ctx.model, api_key=secret, sampling=sampling)
        )
        task_input = getattr(data, "input", None)
        if inspect.iscoroutinefunction(agent) or inspect.iscoroutinefunction(getattr(agent, "__call__", None)):  # noqa: B004
            result = await agent(task_input, resources)
        else:
            result = await asyncio.to_thread(agent, task_input, resources)
        if result is not None:
            trace.info[REWARD_INFO_KEY] = reward_number(result, "the agent's returned reward")
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")


class AgentboltEnvConfig(vf.EnvConfig):
    """One seat, ``agent``, in the subprocess runtime (the exported harness runs in-process)."""

    agent: vf.AgentConfig = vf.AgentConfig(runtime=SubprocessConfig())
    """The seat the exported agent plays (``--env.agent.*``)."""


class AgentboltEnv(vf.Env[AgentboltEnvConfig]):
    """The single-agent episode of an exported agentbolt agent."""

    async def run(self, task: vf.Task, agents: vf.Agents) -> None:
        await agents.agent.run(task)


class ExportedEnvironment(NamedTuple):
    """The classes a verifiers environment package exports in ``__all__``."""

    taskset: type[AgentboltTaskset]
    harness: type[AgentboltHarness]
    env: type[AgentboltEnv]


def export_environment(agent: Any, tasks: Sequence[Any], *, name: str = "Agentbolt") -> ExportedEnvironment:
    """The taskset, harness and env classes of a verifiers environment that runs ``agent`` on
    ``tasks``: export them in the ``__all__`` of the environment's module (see the module
    docstring).

    Args:
        agent: an agentbolt agent (a function ``(task, resources) -> reward``, an object with
            such a ``rollout`` method, or ``"module:attr"``); it must return its reward.
        tasks: the dataset, as ``Trainer.fit`` takes it (items or :class:`agentbolt.types.Task`).
        name: the prefix of the class names (``{name}Taskset``, ``{name}Harness``, ``{name}Env``).
    """
    fn = load_agent(agent)
    items = tuple(as_tasks(tasks))
    if not items:
        raise UserError("export_environment needs at least one task")
    taskset = type(f"{name}Taskset", (AgentboltTaskset,), {"agentbolt_tasks": items, "__module__": _caller()})
    harness = type(f"{name}Harness", (AgentboltHarness,), {"agentbolt_agent": fn, "__module__": _caller()})
    env = type(f"{name}Env", (AgentboltEnv,), {"__module__": _caller()})
    return ExportedEnvironment(taskset, harness, env)


def _caller() -> str:
    """The module calling :func:`export_environment` (the environment package)."""
    frame = inspect.currentframe()
    for _ in range(2):
        frame = frame.f_back if frame is not None else None
    return str(frame.f_globals.get("__name__", __name__)) if frame is not None else __name__
