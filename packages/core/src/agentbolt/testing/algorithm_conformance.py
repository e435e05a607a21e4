"""Conformance tests for algorithms: a suite a plugin author subclasses.

    from agentbolt.testing.algorithm_conformance import AlgorithmConformance

    class TestMyAlgorithm(AlgorithmConformance):
        supports_resume = True  # only if the algorithm claims to resume from a checkpoint

        def make_algorithm(self, tmp_path, *, steps, resume_from=None):
            return MyAlgorithm(model="tiny", steps=steps, out_dir=tmp_path, resume=resume_from)

        def checkpoint_of(self, result):  # only with supports_resume
            return result.checkpoint

Each test runs the algorithm through a real :class:`~agentbolt.trainer.Trainer` (in-memory store,
in-process runner, the gateway) with :meth:`AlgorithmConformance.agent`, a small agent that
calls ``resources.llm`` with the OpenAI client and is rewarded by the parity of the reply's
length (override ``agent`` for an algorithm that needs something else, e.g. a prompt resource).
The contract checked:

- **publishes resources before enqueueing**: every rollout names a resources version that is in
  the store (``ctx.publish`` before ``ctx.run_rollouts``);
- **records a run**: the run is in the store, succeeded, and its rollouts carry its ``run_id``;
- **handles failed rollouts**: some rollouts raising does not fail the run;
- **handles empty batches**: when every rollout fails, the algorithm finishes or raises a
  :class:`~agentbolt.errors.UserError` (a clear message), never another exception;
- **respects cancellation**: cancelling ``Trainer.afit`` while rollouts run ends the run promptly,
  recorded as cancelled;
- **resumes from a checkpoint** (``supports_resume``): a run started from the first run's
  checkpoint succeeds and continues from it (:meth:`assert_resumed`).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, ClassVar

import pytest

from .. import types as t
from ..algorithm import Algorithm
from ..errors import UserError
from ..options import RunnerOptions
from ..store.memory import MemoryStore
from ..store.run_records import RolloutSearch, RunStatus
from ..trainer import Trainer

__all__ = ["AlgorithmConformance", "conformance_tasks", "parity_agent"]


def conformance_tasks(n: int, *, fail: bool = False) -> list[dict[str, Any]]:
    """``n`` small tasks (``fail``: the :func:`parity_agent` raises on them)."""
    return [{"task_id": f"c{i}", "question": f"What is {i} + {i}?", "fail": fail} for i in range(n)]


async def parity_agent(task: dict[str, Any], resources: t.Resources) -> float:
    """Calls the published LLM once; reward 1.0 for an odd-length reply, else 0.0. Raises on
    tasks marked ``fail`` (a failing rollout)."""
    import openai

    if task.get("fail"):
        raise RuntimeError(f"task {task['task_id']} fails on purpose (conformance: failed rollouts)")
    if resources.llm is None:
        raise RuntimeError("no LLM in the resources: publish resources.llm before enqueueing rollouts")
    client = openai.AsyncOpenAI(base_url=resources.llm.base_url, api_key="none", max_retries=0)
    reply = await client.chat.completions.create(
        model=resources.llm.model, messages=[{"role": "user", "content": task["question"]}]
    )
    return float(len(reply.choices[0].message.content or "") % 2)


@pytest.mark.asyncio
class AlgorithmConformance:
    """Subclass and implement :meth:`make_algorithm` (and, with ``supports_resume``,
    :meth:`checkpoint_of`)."""

    supports_resume: ClassVar[bool] = False
    """Set when the algorithm resumes from a checkpoint (``make_algorithm(resume_from=...)``)."""
    steps: ClassVar[int] = 2
    """Training steps of each conformance run (keep small)."""
    n_train: ClassVar[int] = 4
    """Training tasks per run."""
    n_val: ClassVar[int] = 2
    """Held-out tasks per run."""
    cancel_within_s: ClassVar[float] = 120.0
    """How long a cancelled run may take to end (generous: CI machines are slow)."""
    agent: ClassVar[Any] = staticmethod(parity_agent)
    """The agent every conformance run trains."""

    def make_algorithm(self, tmp_path: Path, *, steps: int, resume_from: str | None = None) -> Algorithm:
        """A fresh, small instance of the algorithm writing under ``tmp_path``."""
        raise NotImplementedError("subclass AlgorithmConformance and implement make_algorithm")

    def checkpoint_of(self, result: Any) -> str:
        """The checkpoint a finished run left (``supports_resume`` only)."""
        raise NotImplementedError("supports_resume: implement checkpoint_of(result)")

    def assert_resumed(self, first: Any, resumed: Any) -> None:
        """What shows that ``resumed`` continued from ``first``'s checkpoint (override to check
        more). Default: a ``policy_version`` attribute, when both have one, went up."""
        before, after = getattr(first, "policy_version", None), getattr(resumed, "policy_version", None)
        if before is not None and after is not None:
            assert after > before, f"resumed run's policy_version {after} did not continue from {before}"

    # -- helpers ----------------------------------------------------------------------------------

    def trainer(self, algorithm: Algorithm, store: MemoryStore) -> Trainer:
        return Trainer(
            self.agent,
            algorithm,
            store=store,
            runners=RunnerOptions(n=0, concurrency=8, max_attempts=1),
            progress=False,
        )

    async def _fit(self, tmp_path: Path, *, train: list[dict[str, Any]] | None = None, **kw: Any) -> tuple[Any, Any]:
        store = MemoryStore("memory://")  # type: ignore[abstract]  # Store's operations are derived from its declarations at run time (store.operations)
        algorithm = self.make_algorithm(tmp_path, steps=kw.pop("steps", self.steps), **kw)
        result = await self.trainer(algorithm, store).afit(
            conformance_tasks(self.n_train) if train is None else train, conformance_tasks(self.n_val)
        )
        return result, store

    @staticmethod
    async def _rollouts(store: MemoryStore) -> list[t.Rollout]:
        return (await store.search_rollouts(RolloutSearch(limit=1000))).items

    # -- the contract -----------------------------------------------------------------------------

    async def test_publishes_resources_before_enqueueing_and_records_a_run(self, tmp_path: Path) -> None:
        _, store = await self._fit(tmp_path)
        runs = await store.list_runs()
        assert len(runs) == 1, "the trainer records one run per fit"
        run = runs[0]
        assert run.status is RunStatus.SUCCEEDED, run.error
        rollouts = await self._rollouts(store)
        assert rollouts, "the algorithm ran no rollout"
        for r in rollouts:
            assert r.resources_version is not None, f"{r.rollout_id} was enqueued before any ctx.publish"
            assert await store.get_resources(r.resources_version) is not None
            assert r.run_id == run.run_id
        failed = {
            r.rollout_id: (r.status.value, r.error) for r in rollouts if r.status is not t.RolloutStatus.SUCCEEDED
        }
        assert not failed, f"rollouts of a run without failing tasks did not succeed: {failed}"

    async def test_handles_failed_rollouts(self, tmp_path: Path) -> None:
        half = self.n_train // 2 or 1
        train = conformance_tasks(self.n_train)
        train[:half] = [{**task, "fail": True} for task in train[:half]]
        _, store = await self._fit(tmp_path, train=train)
        (run,) = await store.list_runs()
        assert run.status is RunStatus.SUCCEEDED, f"failed rollouts failed the run: {run.error}"
        assert any(r.status is t.RolloutStatus.FAILED for r in await self._rollouts(store))

    async def test_handles_empty_batches(self, tmp_path: Path) -> None:
        store = MemoryStore("memory://")  # type: ignore[abstract]  # Store's operations are derived from its declarations at run time (store.operations)
        algorithm = self.make_algorithm(tmp_path, steps=self.steps)
        try:
            await self.trainer(algorithm, store).afit(
                conformance_tasks(self.n_train, fail=True), conformance_tasks(self.n_val)
            )
        except UserError:
            # a clear message is fine ("nothing to train on"), recorded as the run's failure
            (run,) = await store.list_runs()
            assert run.status is RunStatus.FAILED and run.error, "a UserError must fail the recorded run"
            return
        (run,) = await store.list_runs()
        assert run.status is RunStatus.SUCCEEDED, run.error
        train = [r for r in await self._rollouts(store) if r.mode is t.RolloutMode.TRAIN]
        assert train and all(r.status is t.RolloutStatus.FAILED for r in train)

    async def test_respects_cancellation(self, tmp_path: Path) -> None:
        store = MemoryStore("memory://")  # type: ignore[abstract]  # Store's operations are derived from its declarations at run time (store.operations)
        algorithm = self.make_algorithm(tmp_path, steps=max(self.steps, 50))
        fit = asyncio.ensure_future(
            self.trainer(algorithm, store).afit(conformance_tasks(self.n_train), conformance_tasks(self.n_val))
        )
        while not await self._rollouts(store):
            assert not fit.done(), f"the run ended before any rollout: {fit.exception() if fit.done() else ''}"
            await asyncio.sleep(0.05)
        fit.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(fit, self.cancel_within_s)
        (run,) = await store.list_runs()
        assert run.status is RunStatus.CANCELLED

    async def test_resumes_from_a_checkpoint(self, tmp_path: Path) -> None:
        if not self.supports_resume:
            pytest.skip("the algorithm does not claim to resume from a checkpoint")
        first, _ = await self._fit(tmp_path / "first")
        checkpoint = self.checkpoint_of(first)
        assert checkpoint, "checkpoint_of() returned no checkpoint"
        assert await asyncio.to_thread(Path(checkpoint).exists), f"no checkpoint at {checkpoint!r}"
        resumed, store = await self._fit(tmp_path / "resumed", resume_from=checkpoint)
        (run,) = await store.list_runs()
        assert run.status is RunStatus.SUCCEEDED, run.error
        self.assert_resumed(first, resumed)
