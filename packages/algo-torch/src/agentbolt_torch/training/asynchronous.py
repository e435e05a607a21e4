"""Asynchronous training for ``torch-grpo`` / ``torch-sft``: rollouts do not wait for the update.

On when the algorithm's :attr:`LightningRLConfig.max_staleness
<agentbolt.lightningrl.LightningRLConfig.max_staleness>` is set (``Trainer.fit(...,
max_staleness=K)``, the examples' ``--async K``). With K the bound and u the training steps
finished so far:

1. Tasks come in the synchronous loop's order (``batches(train, batch_size)``), one GRPO group
   per task. Data batch b is enqueued once ``b <= u + K``: at most K batches run ahead of the
   one being trained. K = 0 is the synchronous schedule (the same rollouts in the same order,
   the same update).
2. A step trains the oldest *finished* groups, as many as its data batch has: it does not wait
   for a straggler once enough groups have finished; a later step takes the straggler.
3. Its rows come from LightningRL with ``policy_version`` = the version being updated: calls
   sampled more than K versions earlier are left out and counted (``lightningrl/excluded/stale``;
   a rollout that spans a swap has calls of several versions, each checked on its own). With
   ``rollout_is`` / ``rollout_rs`` the updater recomputes the proximal logprobs and applies
   the correction.
4. The update trains the policy while the policy server answers from its serving copy
   (:mod:`agentbolt_torch.generation.serving_copy`); then the new weights are swapped in (``swap="inplace"``
   between two decode steps, or ``"drain"``: the gateway paused and drained first), the
   resources of the new version are published and the next data batch may start.
5. Evaluation (every ``val_every`` steps) runs on the current weights while training rollouts
   go on, unless its sampling differs from training's: the gateway forces one set of sampling
   parameters, so then the rollouts in flight finish first.
6. At the end, rollouts still queued or running are cancelled in the store; they and finished
   groups no step took are ``TorchGRPOResult.untrained_rollouts``.

Metrics per step, beside the synchronous ones: ``lightningrl/staleness/<k>`` (the histogram of
the trained calls' staleness), ``lightningrl/staleness_mean`` / ``_max``, ``async/stale_calls``,
``time/trainer_wait_s`` (the trainer waiting for finished groups), ``time/rollouts_wait_s`` (no
training rollout could run: every admitted one had finished, or a swap stopped generation),
both as shares of the step (``time/*_wait_share``), ``time/swap_s``, ``async/carried_rows``
(calls continuing across an in-place swap), ``async/groups_ahead`` and, under correction,
``update/is_weight_mean`` / ``is_weight_max`` / ``is_clipped_frac`` / ``rs_masked_frac``.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import dataclasses
import itertools
import logging
import math
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentbolt import types as t
from agentbolt.algorithm import AlgorithmContext, batches

from ..generation.serving_copy import SwapResult
from .run_state import RunState, TrainingSteps, engine_delta, wait_shares

__all__ = ["GroupStream", "add_async_argument", "rollouts_in_flight", "train_async"]

log = logging.getLogger(__name__)

_DRAIN_TIMEOUT_S = 120.0


@dataclass
class _Group:
    """One task's ``group_size`` rollouts."""

    index: int
    """Enqueue order over the run."""
    batch: int
    """The data batch it belongs to (0-based)."""
    rollout_ids: list[str]
    rollouts: list[t.Rollout] = field(default_factory=list)
    """The final states, once every rollout is final."""

    def __lt__(self, other: _Group) -> bool:
        return self.index < other.index


class GroupStream:
    """Enqueues data batches of GRPO groups ahead of training as far as the staleness bound
    allows, and hands out finished groups, oldest first.

    Args:
        ctx: the algorithm context (store, progress).
        data: the data batches in training order.
        group_size: rollouts per task.
        max_staleness: batch b may start once ``b <= finished steps + max_staleness``.
        tag: rollout-id tag prefix; batch b's rollouts are tagged ``f"{tag}{b + 1}"`` with
            ``step=b + 1``, as the synchronous loop tags them.
        poll_s: how often the finished groups are looked for while some run.
    """

    def __init__(
        self,
        ctx: AlgorithmContext,
        data: Sequence[Sequence[t.Task]],
        *,
        group_size: int,
        max_staleness: int,
        tag: str,
        poll_s: float = 0.25,
    ) -> None:
        self.ctx = ctx
        self.data = [list(batch) for batch in data]
        self.group_size = group_size
        self.max_staleness = max_staleness
        self.tag = tag
        self.poll_s = poll_s
        self.finished_steps = 0
        self.idle_s = 0.0
        """Seconds so far with data left but no training rollout queued or running."""
        self._next_batch = 0
        self._held = False
        self._inflight: dict[str, _Group] = {}
        self._ready: list[_Group] = []
        self._groups = 0
        self._idle_since: float | None = time.monotonic()
        self._changed = asyncio.Event()
        """Set when groups are enqueued or finish; cleared only by the one waiting consumer
        (:meth:`take`, :meth:`settle`)."""
        self._work = asyncio.Event()
        """Set when groups are enqueued: wakes the watcher when nothing was in flight."""
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None

    # -- control ----------------------------------------------------------------------------------

    async def start(self) -> None:
        """Enqueue what the bound admits and start watching for finished groups."""
        await self._enqueue_admitted()
        self._task = asyncio.ensure_future(self._watch())

    async def step_done(self) -> None:
        """A training step finished (updated and swapped, or skipped): the next batch may start."""
        self.finished_steps += 1
        await self._enqueue_admitted()

    async def settle(self) -> None:
        """Enqueue nothing more and wait until every group in flight has finished."""
        self._held = True
        while self._inflight:
            await self._wait_change()

    async def release(self) -> None:
        """Undo :meth:`settle`."""
        self._held = False
        await self._enqueue_admitted()

    async def take(self, n: int, phase: Any = None) -> list[_Group]:
        """The ``n`` oldest finished groups (fewer only when nothing else can finish), waiting for them."""
        shown = 0
        while len(self._ready) < n and (self._inflight or self._can_enqueue()):
            if phase is not None and len(self._ready) > shown:
                phase.advance((len(self._ready) - shown) * self.group_size)
                shown = len(self._ready)
            await self._wait_change()
        taken, self._ready = self._ready[:n], self._ready[n:]
        if phase is not None:
            phase.advance(max(0, len(taken) - shown) * self.group_size)
            phase.done()
        return taken

    async def close(self) -> int:
        """Stop; cancel the rollouts still queued or running. Returns the rollouts left untrained
        (cancelled here, or finished but taken by no step)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        ids = [rid for group in self._inflight.values() for rid in group.rollout_ids]
        if ids:
            await self.ctx.store.cancel(ids, reason="training ended before this rollout was trained")
        left = len(ids) + sum(len(g.rollout_ids) for g in self._ready)
        self._inflight.clear()
        self._ready.clear()
        return left

    @property
    def ahead(self) -> int:
        """Groups enqueued and not yet taken by a step."""
        return len(self._inflight) + len(self._ready)

    def state(self) -> dict[str, Any]:
        """A snapshot for monitoring (plain values, JSON-serialisable). Plain reads, so it may be
        called from another thread, its values then a moment apart: ``next_batch`` (the next data
        batch to enqueue) of ``batches``, ``finished_steps``, ``held`` (:meth:`settle` stopped
        enqueueing), groups ``in_flight`` (their ``in_flight_rollouts`` and the data batches
        ``in_flight_batches`` they belong to), groups ``ready`` and not yet taken, ``idle_s``."""
        in_flight = list(self._inflight.values())
        return {
            "next_batch": self._next_batch,
            "batches": len(self.data),
            "finished_steps": self.finished_steps,
            "held": self._held,
            "in_flight": len(in_flight),
            "in_flight_rollouts": sum(len(g.rollout_ids) for g in in_flight),
            "in_flight_batches": sorted({g.batch for g in in_flight}),
            "ready": len(self._ready),
            "idle_s": round(self.idle_s, 3),
        }

    # -- inside ------------------------------------------------------------------------------------

    def _can_enqueue(self) -> bool:
        return (
            not self._held
            and self._next_batch < len(self.data)
            and self._next_batch <= self.finished_steps + self.max_staleness
        )

    async def _enqueue_admitted(self) -> None:
        async with self._lock:
            while self._can_enqueue():
                b = self._next_batch
                rollouts = await self.ctx.enqueue_rollouts(
                    self.data[b], group_size=self.group_size, tag=f"{self.tag}{b + 1}", step=b + 1
                )
                self._next_batch += 1
                for i in range(0, len(rollouts), self.group_size):
                    ids = [r.rollout_id for r in rollouts[i : i + self.group_size]]
                    group = _Group(self._groups, b, ids)
                    self._groups += 1
                    self._inflight[rollouts[i].group_id or ids[0]] = group
                self._busy()
            self._work.set()
            self._changed.set()

    def _busy(self) -> None:
        if self._idle_since is not None:
            self.idle_s += time.monotonic() - self._idle_since
            self._idle_since = None

    async def _watch(self) -> None:
        """Move groups whose rollouts are all final to the ready list, oldest first."""
        store = self.ctx.store
        while True:
            if not self._inflight:
                if self._idle_since is None and self._next_batch < len(self.data):
                    self._idle_since = time.monotonic()
                # Its own event: clearing the consumer's here could swallow a wake-up that
                # take() has not started waiting for yet (a step then waited forever).
                self._work.clear()
                await self._work.wait()
                continue
            groups = list(self._inflight.items())
            ids = [rid for _, group in groups for rid in group.rollout_ids]
            states = {r.rollout_id: r for r in await store.wait_for_rollouts(ids, timeout=self.poll_s)}
            moved = False
            for key, group in groups:
                finals = [states[rid] for rid in group.rollout_ids]
                if all(r.status.is_final for r in finals):
                    group.rollouts = finals
                    self._inflight.pop(key, None)
                    bisect.insort(self._ready, group)
                    moved = True
            if moved:
                self._changed.set()

    async def _wait_change(self) -> None:
        """Wait until the watcher or an enqueue changes something (re-raising the watcher's error)."""
        self._changed.clear()
        waiter = asyncio.ensure_future(self._changed.wait())
        watched = [waiter] if self._task is None else [waiter, self._task]
        try:
            await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        if self._task is not None and self._task.done():
            self._task.result()  # raises what stopped the watcher
            raise RuntimeError("the rollout watcher stopped")


async def train_async(steps: TrainingSteps, run: RunState, train: Sequence[t.Task], val: Sequence[t.Task]) -> None:
    """The asynchronous schedule (module doc) of ``steps`` (:class:`~agentbolt_torch.training.algorithm.TorchGRPO`),
    through its public step interface; ``run.generator`` serves the copy it swaps."""

    ctx, engine, plan = run.ctx, run.generator, steps.plan
    bound = plan.max_staleness
    assert bound is not None
    epochs = max(1, math.ceil(plan.steps * plan.batch_size / max(1, len(train))))
    data = list(itertools.islice(batches(train, plan.batch_size, epochs=epochs, seed=plan.seed), plan.steps))
    stream = GroupStream(ctx, data, group_size=plan.group_size, max_staleness=bound, tag=plan.tag)
    await steps.publish_training(run)
    run.stream = stream  # TorchGRPO.state() reports it
    try:
        await stream.start()
        last_end = time.monotonic()
        idle_mark = 0.0
        for step, batch in enumerate(data, start=1):
            engine_before = engine.stats
            waiting = time.monotonic()
            phase = ctx.progress.phase(
                f"{plan.label} {step}/{plan.steps} (async, max_staleness={bound})", len(batch) * plan.group_size
            )
            groups = await stream.take(len(batch), phase)
            waited = time.monotonic() - waiting
            if not groups:
                log.warning("step %d: no rollouts left to train on; stopping", step)
                break
            await asyncio.to_thread(ctx.gateway.flush)  # the finished rollouts' spans are in the store
            rollouts = [r for group in groups for r in group.rollouts]
            swap: list[SwapResult] = []

            async def update(rows: list[Any], swap: list[SwapResult] = swap) -> tuple[Any, dict[str, float]]:
                result = await asyncio.to_thread(run.updater.update, rows)  # the server keeps serving the copy
                done = await swap_weights(plan.swap, ctx, engine)
                swap.append(done)
                await steps.publish_training(run)
                return result, {
                    "time/swap_s": done.paused_s,
                    "time/swap_wait_s": done.wait_s,
                    "async/carried_rows": float(done.carried_rows),
                }

            values = await steps.train_rollouts(
                run, step, rollouts, update=update, timing={"time/trainer_wait_s": waited, "time/rollouts_s": waited}
            )
            await stream.step_done()
            now = time.monotonic()
            elapsed, last_end = now - last_end, now
            if values is not None:
                run.step_times.append(elapsed)
                idle, idle_mark = stream.idle_s - idle_mark, stream.idle_s
                paused = swap[0].paused_s if swap else 0.0
                values.update(engine_delta(engine_before, engine.stats))
                values.update(wait_shares(values, elapsed, rollouts_wait_s=idle + paused))
                values["time/step_s"] = elapsed
                values["async/stale_calls"] = values.get("lightningrl/excluded/stale", 0.0)
                values["async/groups_ahead"] = float(stream.ahead)
                run.log_step(step, values)
            started_after = time.monotonic()
            await steps.after_step(run, step, val, around_eval=_evaluation_guard(steps, run, stream))
            last_end += time.monotonic() - started_after  # evaluation and checkpoints are not step time
            idle_mark = stream.idle_s
    finally:
        run.untrained_rollouts = await stream.close()
        run.stream = None
    if run.untrained_rollouts:
        log.info("%d rollouts started ahead were not trained (training ended)", run.untrained_rollouts)


async def swap_weights(swap: str, ctx: AlgorithmContext, engine: Any) -> SwapResult:
    """Serve the updated weights: in place between two decode steps (``swap="inplace"``), or
    (``"drain"``) with the gateway paused and its calls in flight drained first."""
    if swap == "inplace":
        return await asyncio.to_thread(engine.swap_weights, drain=False)
    started = time.monotonic()
    await asyncio.to_thread(ctx.gateway.pause)
    try:
        await asyncio.to_thread(ctx.gateway.drain, _DRAIN_TIMEOUT_S)
        drained = time.monotonic() - started
        done: SwapResult = await asyncio.to_thread(engine.swap_weights, drain=True, timeout=_DRAIN_TIMEOUT_S)
    finally:
        await asyncio.to_thread(ctx.gateway.resume)
    return dataclasses.replace(done, wait_s=done.wait_s + drained)


def _evaluation_guard(steps: TrainingSteps, run: RunState, stream: GroupStream) -> Any:
    """What surrounds an evaluation during asynchronous training: with sampling parameters other
    than training's, the training rollouts in flight finish first (the gateway forces one set);
    afterwards training's resources are published again."""

    @contextlib.asynccontextmanager
    async def guard() -> AsyncIterator[None]:
        differs = steps.plan.evaluation_sampling_differs
        if differs:
            await stream.settle()
        try:
            yield
        finally:
            await steps.publish_training(run)
            if differs:
                await stream.release()

    return guard


def rollouts_in_flight(batch_size: int, group_size: int, max_staleness: int | None) -> int:
    """How many rollouts may run at once: a step's, and asynchronously the next ``max_staleness``
    steps' too (give the runners this much concurrency so the admitted rollouts all run)."""
    return batch_size * group_size * (1 + (max_staleness or 0))


def add_async_argument(parser: argparse.ArgumentParser) -> None:
    """The examples' ``--async K`` option (``args.max_staleness``; ``None`` when not given)."""
    parser.add_argument(
        "--async",
        dest="max_staleness",
        type=int,
        metavar="K",
        help="train asynchronously: rollouts of the next K batches run while the policy updates; calls sampled "
        "more than K versions before the trained one are dropped and counted (0: on-policy; default: synchronous)",
    )
