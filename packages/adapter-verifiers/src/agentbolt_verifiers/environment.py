"""A verifiers environment as agentbolt tasks plus the agent that plays them.

    import verifiers.v1 as vf
    from agentbolt import Trainer
    from agentbolt_verifiers import load_environment, tasks

    env = load_environment("reverse-text", agent={"harness": {"id": "null"}})
    Trainer(env).dev(tasks(env), llm="http://127.0.0.1:8000/v1", model="qwen")

The mapping:

- **dataset → tasks**: each task of the environment's taskset becomes an agentbolt task whose
  input is the task's wire data (``TaskData`` as JSON) and whose id is the task's own ``id`` or,
  without one, its content key (``Task.key``).
- **rollout → agent**: each agentbolt rollout runs one verifiers episode of that task
  (``Env.run_episode``: the env's agents, harness, runtime and tool servers) with the episode's
  model client pointed at the rollout's gateway URL. verifiers' interception relays every model
  call to that URL, so the gateway records every call with exact token ids.
- **rubric → reward**: the episode's score becomes the rollout's final reward. A single-agent
  episode has one trace: its reward (the weighted sum of its ``@vf.reward`` functions and
  judges), with each named reward recorded as a dimension. An episode with several trainable
  traces (multi-agent envs) scores the mean of their rewards.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

from agentbolt import types as t
from agentbolt.capture.emit import emit_observation, emit_reward
from agentbolt.errors import UserError

if TYPE_CHECKING:
    import verifiers.v1 as vf

__all__ = [
    "VerifiersAgent",
    "VerifiersEpisodeError",
    "episode_reward",
    "load_environment",
    "parse_reference",
    "tasks",
]

log = logging.getLogger(__name__)

REWARD_DIMENSION = "reward"
"""The name of the trained dimension of the final reward (the episode's score)."""


class VerifiersEpisodeError(RuntimeError):
    """A verifiers episode ended without a valid result (``Episode.ok`` is false): a harness,
    runtime, model or scoring error the episode recorded. The rollout fails with its errors."""


def _vf() -> Any:
    try:
        import verifiers.v1 as vf
    except ImportError as exc:  # pragma: no cover - the package depends on verifiers
        raise UserError(f"agentbolt-verifiers needs verifiers 0.4 (pip install agentbolt-verifiers): {exc}") from exc
    return vf


def load_environment(name: str, **config: Any) -> vf.Env:
    """The installed verifiers environment ``name`` (a taskset package id, e.g. ``"reverse-text"``),
    built with ``config`` (the fields of its ``EnvConfig``, as ``vf-eval``'s ``--env.*`` flags
    give them: ``agent={"harness": {"id": "null"}}``, ``taskset={"num_tasks": 50}``, ...).

    Every agent role runs in the ``subprocess`` runtime on this machine unless ``config`` pins
    another (verifiers' own default is Prime's remote sandboxes, which needs a Prime account).
    """
    vf = _vf()
    from verifiers.v1.configs.agent import AgentConfig

    raw: dict[str, Any] = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in config.items()}
    taskset = dict(raw.get("taskset") or {})
    taskset["id"] = name
    raw["taskset"] = taskset
    try:
        vf.import_taskset(name)
    except ModuleNotFoundError as exc:
        raise UserError(f"verifiers environment {name!r} is not installed ({exc}); install its package first") from exc
    cls = vf.env_config_type(name, raw.get("id") or "")
    for role, field in cls.model_fields.items():
        if isinstance(field.default, AgentConfig):
            seat = dict(raw.get(role) or {})
            seat.setdefault("runtime", {"type": "subprocess"})
            raw[role] = seat
    return vf.load_environment(vf.resolve_env_config(raw))


def parse_reference(reference: str) -> tuple[str, dict[str, Any]]:
    """``"NAME?a.b=1&c=x"`` -> ``("NAME", {"a": {"b": "1"}, "c": "x"})``: an environment id and
    the config its query sets (dotted keys nest, as ``vf-eval``'s ``--env.a.b`` flags; pydantic
    validates the values)."""
    name, _, query = reference.partition("?")
    if not name:
        raise UserError(f"verifiers environment reference {reference!r} names no environment")
    config: dict[str, Any] = {}
    for key, value in parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query)):
        *path, last = key.split(".")
        node = config
        for part in path:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise UserError(f"config key {key!r} in {reference!r} nests under a value already set")
            node = child
        node[last] = value
    return name, config


def tasks(env: vf.Env, *, limit: int | None = None) -> list[t.Task]:
    """The environment's taskset as agentbolt tasks (the first ``limit`` when given).

    Each task's input is its verifiers wire data; its id is the task's ``id`` when the taskset
    sets one, else its content key; ``metadata`` keeps the key and the position in the taskset.
    """
    taskset = env.taskset if limit is None else env.taskset.take(limit)
    if not taskset.bounded:
        raise UserError("this taskset is infinite: pass limit= to take a finite number of tasks")
    out: list[t.Task] = []
    for task in taskset:
        data = task.data.model_dump(mode="json", exclude_none=True)
        out.append(
            t.Task(
                task_id=str(task.data.id or task.key),
                input=data,
                metadata={"verifiers_key": task.key, "verifiers_idx": task.data.idx},
            )
        )
    return out


def episode_reward(episode: Any) -> tuple[float, dict[str, float]]:
    """The reward of a finished episode and its named dimensions, as agentbolt records them:
    the mean reward of its trainable traces (one trace: its reward), and, for a one-trace
    episode, each named reward's score. Raises :class:`VerifiersEpisodeError` for an episode
    that did not end with a valid result."""
    if not episode.ok:
        errors = "; ".join(f"{e.type}: {e.message}" for e in episode.errors) or "no error recorded"
        trace_errors = "; ".join(f"{e.type}: {e.message}" for tr in episode.traces for e in tr.errors)
        raise VerifiersEpisodeError(
            f"verifiers episode failed: {errors}" + (f" (traces: {trace_errors})" if trace_errors else "")
        )
    traces = [tr for tr in episode.traces if tr.agent.trainable] or list(episode.traces)
    value = sum(tr.reward for tr in traces) / len(traces)
    dims = {REWARD_DIMENSION: value}
    if len(traces) == 1:
        for name, reward in traces[0].rewards.items():
            if reward is not None and name != REWARD_DIMENSION:
                dims[name] = reward.score
    return value, dims


class _Serving:
    """The environment's serving resources (interception, shared tool servers), held open by
    one task while rollouts of one event loop use them: ``Env.serving()`` keeps them on the
    env object, so concurrent rollouts must share one."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self.users = 0
        self.lock = asyncio.Lock()
        self.ready: asyncio.Future[None] | None = None
        self.stop: asyncio.Event | None = None
        self.holder: asyncio.Task[None] | None = None

    async def _hold(self, ready: asyncio.Future[None], stop: asyncio.Event) -> None:
        try:
            async with self.env.serving():
                ready.set_result(None)
                await stop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            raise

    async def acquire(self) -> None:
        async with self.lock:
            if self.users == 0:
                loop = asyncio.get_running_loop()
                self.ready, self.stop = loop.create_future(), asyncio.Event()
                self.holder = asyncio.create_task(self._hold(self.ready, self.stop))
            self.users += 1
            ready = self.ready
        assert ready is not None
        try:
            await asyncio.shield(ready)
        except BaseException:
            await self.release()
            raise

    async def release(self) -> None:
        async with self.lock:
            self.users -= 1
            if self.users > 0:
                return
            stop, holder = self.stop, self.holder
            self.stop = self.holder = self.ready = None
        if stop is not None:
            stop.set()
        if holder is not None:
            try:
                await holder
            except Exception:  # already reported to the rollouts that waited on it
                log.debug("verifiers serving ended with an error", exc_info=True)


class VerifiersAgent:
    """The agentbolt agent that plays a verifiers environment: ``rollout(task, resources)``
    runs one episode of the task with the model client on the rollout's gateway URL and
    returns the episode's reward (see the module docstring for the mapping).

    Args:
        env: a ``verifiers.v1.Env`` or the id of an installed environment package (built with
            :func:`load_environment` and ``config``).
        config: with a package id, the ``EnvConfig`` fields to build it with.
    """

    def __init__(self, env: vf.Env | str, **config: Any) -> None:
        vf = _vf()
        if isinstance(env, str):
            env = load_environment(env, **config)
        elif config:
            raise UserError("config= builds an environment by name; this environment object is already built")
        if not isinstance(env, vf.Env):
            raise UserError(f"VerifiersAgent needs a verifiers.v1 Env or an environment id, got {type(env).__name__}")
        self.env = env
        self._task_cls = type(env.taskset).task_type()
        self._data_cls = self._task_cls.data_type()
        self._servings: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Serving] = weakref.WeakKeyDictionary()

    def __repr__(self) -> str:
        return f"VerifiersAgent({self.env.config.env_id!r})"

    def task(self, data: Any) -> Any:
        """The verifiers task an agentbolt task input stands for (its wire data, validated
        into the taskset's ``TaskData`` type, with the taskset's task config)."""
        if not isinstance(data, Mapping):
            raise UserError(
                f"a verifiers task input is the task's wire data (a JSON object, as tasks(env) makes), got {data!r}"
            )
        return self._task_cls(self._data_cls.model_validate(dict(data)), self.env.config.taskset.task)

    def context(self, resources: t.Resources) -> Any:
        """The verifiers model context of one rollout: its model, a client on its gateway URL,
        and the sampling the resources set."""
        vf = _vf()
        if resources.llm is None:
            raise UserError("no LLM endpoint was published: a verifiers episode needs resources.llm")
        llm = resources.llm
        headers = {"Authorization": f"Bearer {llm.api_key}"} if llm.api_key else {}
        client = vf.EvalClientConfig(base_url=llm.base_url, api_key_var="AGENTBOLT_VERIFIERS_NO_KEY", headers=headers)
        known = set(vf.Sampling.model_fields)
        sampling = vf.Sampling(**{k: v for k, v in llm.sampling.items() if k in known})
        return vf.ModelContext(model=llm.model, client=client, sampling=sampling)

    async def run_episode(self, data: Any, resources: t.Resources) -> Any:
        """One verifiers episode of the task ``data`` under ``resources`` (the env's serving
        resources are shared by the rollouts running at once)."""
        task = self.task(data)
        ctx = self.context(resources)
        loop = asyncio.get_running_loop()
        serving = self._servings.get(loop)
        if serving is None:
            serving = self._servings[loop] = _Serving(self.env)
        await serving.acquire()
        try:
            return await self.env.run_episode(task, ctx)
        finally:
            await serving.release()

    async def rollout(self, task: Any, resources: t.Resources) -> None:
        """Run one episode and record its score as the rollout's final reward (with each named
        reward as a dimension, and the episode's metrics as an observation)."""
        episode = await self.run_episode(task, resources)
        _, dims = episode_reward(episode)
        metrics = {k: v for tr in episode.traces for k, v in tr.metrics.items()}
        if metrics:
            emit_observation({"verifiers_metrics": metrics})
        emit_reward(dims, primary=REWARD_DIMENSION, final=True)
