"""Running the gate's held-out tasks through the agent against one policy version.

An evaluation is ordinary ``val`` rollouts of the serve run (``step`` = the version evaluated),
run by a runner inside the serve process. A candidate's calls go through an evaluation gateway
of their own that forwards to the standby slot (they are recorded like any rollout's); the live
version's baseline runs through the serve gateway itself, on the live slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

from .. import types as t
from ..algorithm import as_tasks
from ..gateway import Gateway, Upstream
from ..runners.runner import AgentLike, Runner, RunnerConfig
from ..store.base import Store
from .gate import GateScore, score_of

__all__ = ["GateRunner"]

log = logging.getLogger(__name__)


class GateRunner:
    """Runs held-out tasks through ``agent`` (in this process) for the gate.

    Args:
        store: the serve store.
        run_id: the serve run (evaluation rollouts carry it).
        agent: the agent, as for ``Trainer`` (a function ``(task, resources) -> reward``, an
            object with ``rollout``, or ``"module:attr"``).
        tasks: the held-out set (dataset items or :class:`~agentbolt.types.Task`).
        samples: rollouts per task.
        sampling: sampling parameters forced on evaluation calls (e.g. ``{"temperature": 0}``).
        concurrency: rollouts at once.
        timeout_s: limit of one evaluation rollout.
    """

    def __init__(
        self,
        store: Store,
        run_id: str,
        agent: AgentLike | str,
        tasks: Sequence[Any],
        *,
        samples: int = 1,
        sampling: dict[str, Any] | None = None,
        concurrency: int = 8,
        timeout_s: float | None = 300.0,
        capture: dict[str, Any] | None = None,
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.agent = agent
        self.tasks = as_tasks(tasks)
        self.samples = samples
        self.sampling = dict(sampling or {})
        self.concurrency = concurrency
        self.timeout_s = timeout_s
        self.capture = dict(capture or {})
        self.gateway: Gateway | None = None
        self._runner: Runner | None = None
        self._runner_task: asyncio.Task[Any] | None = None
        self._stop = asyncio.Event()

    async def start(self) -> None:
        """Start the evaluation gateway and the runner."""
        self.gateway = Gateway(self.store, [], sampling=self.sampling, **self.capture)
        await self.gateway.start()
        config = RunnerConfig(concurrency=self.concurrency, mode=t.RolloutMode.VAL, adapters=[])
        self._runner = Runner(self.agent, self.store, worker_id=f"{self.run_id}-gate", config=config)
        self._runner_task = asyncio.get_running_loop().create_task(self._runner.run(self._stop))

    async def stop(self) -> None:
        self._stop.set()
        if self._runner_task is not None:
            with contextlib.suppress(Exception):
                await self._runner_task
        if self.gateway is not None:
            await self.gateway.stop()

    @property
    def url(self) -> str:
        assert self.gateway is not None
        return f"{self.gateway.url}/v1"

    def use(self, upstream: Upstream, version: int) -> None:
        """Forward evaluation calls to ``upstream`` (the standby slot holding ``version``)."""
        assert self.gateway is not None
        self.gateway.set_upstreams([upstream])
        self.gateway.set_policy(version=version)

    async def evaluate(self, version: int, *, tag: str = "") -> GateScore:
        """Run every held-out task ``samples`` times with resources ``version``; its score."""
        if self._runner_task is not None and self._runner_task.done():
            self._runner_task.result()  # the runner died: say why
        prefix = f"{self.run_id}:gate{tag}:v{version}"
        specs = [
            t.RolloutSpec.from_task(
                task,
                rollout_id=f"{prefix}:{task.task_id}:{k}",
                mode=t.RolloutMode.VAL,
                group_id=f"{prefix}:{task.task_id}",
                resources_version=version,
                max_attempts=2,
                timeout_s=self.timeout_s,
                metadata={"agentbolt.gate.version": version},
                run_id=self.run_id,
                step=version,
            )
            for task in self.tasks
            for k in range(self.samples)
        ]
        rollouts = await self.store.enqueue(specs)
        ids = [r.rollout_id for r in rollouts]
        while True:
            states = await self.store.wait_for_rollouts(ids, timeout=5.0)
            if all(r.status.is_final for r in states):
                break
            if self._runner_task is not None and self._runner_task.done():
                self._runner_task.result()
        if self.gateway is not None:
            await self.gateway.flush()
        score = score_of(version, states)
        log.info("gate: version %d scores %.3f (se %.3f) over %d rollouts", version, score.mean, score.se, len(states))
        return score
