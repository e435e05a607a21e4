"""The algorithm plugin interface, and the built-in :class:`Evaluate` algorithm.

An algorithm drives training: it publishes resources (the policy endpoint and sampling
parameters), enqueues rollouts, waits for them, turns their spans into transitions and updates
the policy. It never imports the agent: runners run the agent, the gateway records the calls.

    class MyAlgorithm(Algorithm):
        name = "mine"

        async def run(self, ctx, train, val):
            await ctx.publish(Resources(llm=LLMEndpoint(base_url=ctx.gateway_url, model="policy")))
            for step, batch in enumerate(batches(train, 8, epochs=3)):
                rollouts = await ctx.run_rollouts(batch, group_size=4, tag=f"step{step}")
                spans = await ctx.spans(rollouts)
                ...

Register it with the ``agentbolt_register_algorithms`` hook to use it by name.
"""

from __future__ import annotations

import abc
import asyncio
import json
import logging
import math
import random
import statistics
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

from . import semconv
from . import types as t
from .errors import UserError
from .lightningrl import LightningRLConfig
from .policies import Policies
from .runs.doctor import diagnose
from .store.base import Store
from .store.run_records import finite_metrics

__all__ = [
    "Algorithm",
    "AlgorithmContext",
    "Evaluate",
    "EvaluateResult",
    "GatewayControl",
    "ProgressReporter",
    "as_tasks",
    "batches",
]

log = logging.getLogger(__name__)


def as_tasks(dataset: Sequence[Any] | None) -> list[t.Task]:
    """Dataset items as tasks: ``Task`` objects stay; any other item becomes the input of a task
    whose id is the item's ``task_id`` (for dicts that have one) or its position."""
    if dataset is None:
        return []
    tasks: list[t.Task] = []
    for i, item in enumerate(dataset):
        if isinstance(item, t.Task):
            tasks.append(item)
        elif isinstance(item, Mapping) and "task_id" in item:
            tasks.append(t.Task(task_id=str(item["task_id"]), input=dict(item)))
        else:
            tasks.append(t.Task(task_id=str(i), input=item))
    ids = [task.task_id for task in tasks]
    if len(set(ids)) != len(ids):
        dup = next(k for k, v in Counter(ids).items() if v > 1)
        raise UserError(f"task_id {dup!r} appears more than once in the dataset; task ids must be unique")
    return tasks


def batches(
    tasks: Sequence[t.Task], batch_size: int, *, epochs: int = 1, shuffle: bool = True, seed: int = 0
) -> Iterator[list[t.Task]]:
    """Successive batches over ``epochs`` passes (shuffled per epoch); the last batch of an
    epoch may be smaller. Deterministic for a given seed."""
    if batch_size < 1:
        raise UserError(f"batch_size must be at least 1, got {batch_size}")
    rng = random.Random(seed)
    for _ in range(epochs):
        order = list(tasks)
        if shuffle:
            rng.shuffle(order)
        for i in range(0, len(order), batch_size):
            yield order[i : i + batch_size]


class GatewayControl(Protocol):
    """What an algorithm may do with the gateway (all thread-safe)."""

    @property
    def url(self) -> str:
        """The gateway's root URL (``http://127.0.0.1:PORT``)."""
        ...

    def pause(self) -> None: ...
    def resume(self) -> None: ...
    def drain(self, timeout: float | None = None) -> bool: ...
    def flush(self, timeout: float | None = 60.0) -> None: ...
    def set_policy(
        self, *, version: int | None = None, sampling: Mapping[str, Any] | None = None, model: str | None = None
    ) -> None: ...
    def set_upstreams(self, upstreams: Sequence[Any]) -> None: ...
    def stats(self) -> dict[str, Any]: ...


class ProgressReporter(Protocol):
    """Where an algorithm reports progress (the trainer draws a rich progress bar)."""

    def phase(self, description: str, total: int | None) -> Any:
        """Start a phase; returns a handle with ``advance(n)`` and ``done()``."""
        ...

    def metrics(self, step: int, values: Mapping[str, float]) -> None:
        """Show the latest metrics."""
        ...


class _NullPhase:
    def advance(self, n: int = 1) -> None:
        pass

    def done(self) -> None:
        pass


class NullProgress:
    """A reporter that only logs."""

    def phase(self, description: str, total: int | None) -> _NullPhase:
        log.info("%s (%s)", description, total if total is not None else "?")
        return _NullPhase()

    def metrics(self, step: int, values: Mapping[str, float]) -> None:
        log.info("step %d: %s", step, ", ".join(f"{k}={v:.4g}" for k, v in values.items()))


@dataclass
class AlgorithmContext:
    """What the trainer gives an algorithm."""

    store: Store
    """The store (use from the algorithm's event loop)."""
    gateway: GatewayControl
    """The gateway agents' calls go through."""
    progress: ProgressReporter = field(default_factory=NullProgress)
    """Progress reporting."""
    max_attempts: int = 3
    """Attempts per rollout for infrastructure failures."""
    timeout_s: float | None = None
    """Per-attempt time limit of rollouts."""
    metrics_path: Path | None = None
    """JSONL file that :meth:`log_metrics` appends to, if set."""
    run_id: str = field(default_factory=lambda: t.new_id("run-"))
    """The run (``Trainer`` records it in the store); prefix of its rollout ids, which carry it."""
    resources_version: int | None = None
    """The latest version :meth:`publish` stored."""
    record_metrics: bool = True
    """Record :meth:`log_metrics` in the store under ``run_id`` (the run must exist there)."""
    policies: Policies = field(default_factory=Policies.shared)
    """The run's policies by role (``Trainer(policies=...)``; one shared policy by default): which
    policy serves and learns from each agent's calls. The gateway already routes by them."""
    _metrics_write: asyncio.Task[None] | None = field(default=None, init=False, repr=False)

    @property
    def gateway_url(self) -> str:
        """The gateway's OpenAI base URL (``.../v1``) to publish as ``resources.llm.base_url``."""
        return f"{self.gateway.url}/v1"

    async def publish(self, resources: t.Resources) -> t.Resources:
        """Store a new resources version; the gateway records it on spans and forces its
        sampling parameters (and model name, when given) from now on."""
        stored = await self.store.add_resources(resources)
        self.resources_version = stored.version
        llm = stored.llm
        await asyncio.to_thread(
            self.gateway.set_policy,
            version=stored.version,
            sampling=dict(llm.sampling) if llm is not None else None,
        )
        return stored

    async def run_rollouts(
        self,
        tasks: Sequence[t.Task],
        *,
        group_size: int = 1,
        mode: t.RolloutMode = t.RolloutMode.TRAIN,
        tag: str = "",
        timeout: float | None = None,
        description: str | None = None,
        step: int | None = None,
    ) -> list[t.Rollout]:
        """Run every task ``group_size`` times and wait for all to be final.

        Rollouts of the same task share a ``group_id`` (``{run}:{tag}:{task_id}``); every rollout
        carries ``run_id`` and ``step`` (the dashboard filters by them). Their spans are in the
        store when this returns (the gateway is flushed). Returns the final rollouts in task
        order; ``timeout`` leaves unfinished ones as they are (check their status).
        """
        rollouts = await self.enqueue_rollouts(tasks, group_size=group_size, mode=mode, tag=tag, step=step)
        ids = [r.rollout_id for r in rollouts]
        phase = self.progress.phase(description or f"{mode.value} rollouts{f' ({tag})' if tag else ''}", len(ids))
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        done = 0
        while True:
            remaining = None if deadline is None else max(0.0, deadline - loop.time())
            states = await self.store.wait_for_rollouts(ids, timeout=1.0 if remaining is None else min(remaining, 1.0))
            finished = sum(r.status.is_final for r in states)
            if finished > done:
                phase.advance(finished - done)
                done = finished
            if finished == len(ids) or (remaining is not None and remaining <= 0):
                break
        phase.done()
        await asyncio.to_thread(self.gateway.flush)
        return states

    async def enqueue_rollouts(
        self,
        tasks: Sequence[t.Task],
        *,
        group_size: int = 1,
        mode: t.RolloutMode = t.RolloutMode.TRAIN,
        tag: str = "",
        step: int | None = None,
    ) -> list[t.Rollout]:
        """Enqueue every task ``group_size`` times and return at once (the queued rollouts, in
        task order): what :meth:`run_rollouts` does before it waits, for an algorithm that keeps
        rollouts running while it trains. Same ids, groups and pinned resources version."""
        if group_size < 1:
            raise UserError(f"group_size must be at least 1, got {group_size}")
        specs = []
        prefix = f"{self.run_id}:{tag}" if tag else self.run_id
        for task in tasks:
            group = f"{prefix}:{task.task_id}"
            for k in range(group_size):
                specs.append(
                    t.RolloutSpec.from_task(
                        task,
                        rollout_id=f"{group}:{k}",
                        mode=mode,
                        group_id=group,
                        resources_version=self.resources_version,
                        max_attempts=self.max_attempts,
                        timeout_s=self.timeout_s,
                        run_id=self.run_id,
                        step=step,
                    )
                )
        return await self.store.enqueue(specs)

    async def spans(self, rollouts: Sequence[t.Rollout]) -> dict[str, list[t.Span]]:
        """The spans of each rollout's final attempt, in ``seq`` order."""
        out: dict[str, list[t.Span]] = {}
        ids = [r.rollout_id for r in rollouts]
        for i in range(0, len(ids), 200):
            out.update(await self.store.query_spans(ids[i : i + 200], latest_attempt_only=True))
        return out

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        """Show metrics, append them to ``metrics_path`` (JSONL) when set, and record the finite
        ones in the store under the run (in the background, in call order; :meth:`flush_metrics`
        waits for them). Call it from the algorithm's event loop."""
        self.progress.metrics(step, metrics)
        if self.metrics_path is not None:
            self.metrics_path.parent.mkdir(parents=True, exist_ok=True)
            with self.metrics_path.open("a") as f:
                f.write(json.dumps({"step": step, "time": time.time(), **metrics}) + "\n")
        if not self.record_metrics:
            return
        values = finite_metrics(metrics)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise UserError("log_metrics records into the store: call it from the algorithm's event loop") from None
        self._metrics_write = loop.create_task(self._record_metrics(self._metrics_write, step, values))

    async def _record_metrics(self, previous: asyncio.Task[None] | None, step: int, values: dict[str, float]) -> None:
        if previous is not None:
            await asyncio.shield(previous)
        try:
            await self.store.add_run_metrics(self.run_id, step, values)
        except Exception as exc:  # metrics must not stop training; the JSONL file still has them
            log.warning("could not record step %d metrics of run %s in the store: %s", step, self.run_id, exc)

    async def flush_metrics(self) -> None:
        """Wait until every :meth:`log_metrics` call so far is recorded in the store."""
        if self._metrics_write is not None:
            await asyncio.shield(self._metrics_write)


class Algorithm(abc.ABC):
    """A training or evaluation procedure. Subclass, implement :meth:`run`, and register it with
    ``agentbolt_register_algorithms`` (or pass an instance to :class:`~agentbolt.trainer.Trainer`)."""

    name: ClassVar[str] = "algorithm"
    asynchronous: ClassVar[bool] = False
    """True when the algorithm trains asynchronously once its ``lightningrl`` config has
    ``max_staleness`` set (see :meth:`set_max_staleness`)."""
    supports_policies: ClassVar[bool] = False
    """True when the algorithm serves and trains several policies by role (``ctx.policies``); the
    trainer refuses per-role policies for an algorithm that does not."""

    def run_config(self) -> dict[str, Any]:
        """Settings recorded with the run (JSON): the public attributes, by default, leaving out
        credentials (names with ``key``, ``token``, ``secret`` or ``password``); a
        :class:`~agentbolt.lightningrl.LightningRLConfig` is recorded as its fields (the dashboard
        rebuilds it from the ``lightningrl`` attribute); other values JSON cannot hold are
        recorded as their ``str``."""

        secret = ("key", "token", "secret", "password")
        public = {
            k: v.as_record() if isinstance(v, LightningRLConfig) else v
            for k, v in vars(self).items()
            if not k.startswith("_") and not any(s in k.lower() for s in secret)
        }
        return json.loads(json.dumps(public, default=str))

    def set_max_staleness(self, max_staleness: int) -> None:
        """Train asynchronously with this staleness bound (what ``Trainer.fit(..., max_staleness=K)``
        calls): rollouts of the next batches run while the policy updates, and a call sampled by a
        policy more than ``max_staleness`` versions older than the one being trained is left out
        and counted, never trained (``0``: on-policy only, the synchronous schedule).

        The bound has one home, :attr:`LightningRLConfig.max_staleness
        <agentbolt.lightningrl.LightningRLConfig.max_staleness>`: this sets it on the algorithm's
        ``lightningrl`` attribute (an algorithm that trains a policy with LightningRL keeps its
        config there and reads the bound from it to schedule its rollouts). An algorithm that
        does not declare :attr:`asynchronous` raises :class:`~agentbolt.errors.UserError`.
        """
        config = getattr(self, "lightningrl", None)
        if not self.asynchronous or not isinstance(config, LightningRLConfig):
            raise UserError(
                f"algorithm {self.name!r} has no asynchronous mode: max_staleness applies to algorithms that "
                "train a policy with LightningRL asynchronously (torch-grpo, torch-sft; agentbolt-verl: "
                "'async' and 'lightningrl.max_staleness' in its YAML)"
            )
        if isinstance(max_staleness, bool) or not isinstance(max_staleness, int) or max_staleness < 0:
            raise UserError(f"max_staleness must be an integer >= 0 (0: on-policy), got {max_staleness!r}")
        self.lightningrl = config.replace(max_staleness=max_staleness)

    def run_model(self) -> str | None:
        """The policy model recorded with the run: the ``model`` attribute when it is a string."""
        model = getattr(self, "model", None)
        return model if isinstance(model, str) else None

    @abc.abstractmethod
    async def run(self, ctx: AlgorithmContext, train: Sequence[t.Task], val: Sequence[t.Task]) -> Any:
        """Do the work; what it returns is what ``Trainer.fit`` returns."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the algorithm started (servers, models); called once at the end."""


# ------------------------------------------------------------------------------------------------
# Evaluate
# ------------------------------------------------------------------------------------------------


@dataclass
class EvaluateResult:
    """What :class:`Evaluate` measured."""

    rollouts: int
    succeeded: int
    failed: int
    cancelled: int
    reward_mean: float | None
    reward_std: float | None
    rewards_missing: int
    """Succeeded rollouts that reported no reward."""
    llm_calls: int
    """Gateway call spans in the store, every attempt (failed calls included)."""
    calls_with_exact_ids: int
    calls_retokenized: int
    calls_missing_ids: int
    """Answered calls without token ids (failed calls are in ``calls_failed``)."""
    prompt_tokens: int
    response_tokens: int
    failures: dict[str, int] = field(default_factory=dict)
    """Failed rollouts by ``kind: type`` (e.g. ``agent: ValueError``, ``timeout: timeout``)."""
    seconds: float = 0.0
    """Time from enqueueing the rollouts to their end (the run's total is longer: start-up)."""
    calls_failed: int = 0
    """Calls the upstream failed (not counted as missing ids)."""
    lightningrl_calls: int = 0
    """LightningRL's calls of the final attempts (equal to their gateway calls: reconciliation)."""
    unjoined_llm_spans: int = 0
    """Framework LLM spans that joined no gateway call (kept as operations, never calls)."""
    rollouts_unreconciled: int = 0
    """Rollouts flagged by reconciliation (not trained; ``report`` says why)."""
    report: Any = field(default=None, repr=False)
    """The :class:`~agentbolt.runs.doctor.DoctorReport` of these rollouts (what ``agentbolt doctor`` prints)."""

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "report"}

    def capture_ok(self) -> bool:
        """True when calls were captured and the doctor found no error or warning."""
        if self.report is not None:
            return self.llm_calls > 0 and bool(self.report.ok)
        return self.llm_calls > 0 and self.calls_with_exact_ids == self.llm_calls


def summarize(
    rollouts: Sequence[t.Rollout],
    spans: Mapping[str, Sequence[t.Span]],
    seconds: float = 0.0,
    *,
    gateway_stats: Mapping[str, Any] | None = None,
) -> EvaluateResult:
    """Counts, rewards and token usage of finished rollouts and their spans (of every attempt:
    the call counts are :func:`agentbolt.runs.doctor.diagnose`'s, the same ``agentbolt doctor`` prints)."""

    report = diagnose(rollouts, spans, gateway_stats=gateway_stats)
    rewards = [r.final_reward for r in rollouts if r.status is t.RolloutStatus.SUCCEEDED and r.final_reward is not None]
    failures: Counter[str] = Counter()
    for r in rollouts:
        if r.status in (t.RolloutStatus.FAILED, t.RolloutStatus.CANCELLED) and r.error is not None:
            failures[f"{r.error.kind.value}: {r.error.type}"] += 1
        elif r.status is not t.RolloutStatus.SUCCEEDED:
            failures[f"unfinished: {r.status.value}"] += 1
    prompt_tokens = response_tokens = 0
    for span_list in spans.values():
        for s in span_list:
            if semconv.TOKEN_SOURCE not in s.attributes:  # only the gateway's spans are calls (adapters' join them)
                continue
            prompt_tokens += len(s.attributes.get(semconv.PROMPT_TOKEN_IDS, ())) or int(
                s.attributes.get(semconv.GEN_AI_USAGE_INPUT_TOKENS, 0)
            )
            response_tokens += len(s.attributes.get(semconv.RESPONSE_TOKEN_IDS, ())) or int(
                s.attributes.get(semconv.GEN_AI_USAGE_OUTPUT_TOKENS, 0)
            )
    succeeded = sum(r.status is t.RolloutStatus.SUCCEEDED for r in rollouts)
    return EvaluateResult(
        rollouts=len(rollouts),
        succeeded=succeeded,
        failed=sum(r.status is t.RolloutStatus.FAILED for r in rollouts),
        cancelled=sum(r.status is t.RolloutStatus.CANCELLED for r in rollouts),
        reward_mean=statistics.fmean(rewards) if rewards else None,
        reward_std=statistics.pstdev(rewards) if len(rewards) > 1 else (0.0 if rewards else None),
        rewards_missing=succeeded - len(rewards),
        llm_calls=report.counts.calls,
        calls_with_exact_ids=report.counts.exact,
        calls_retokenized=report.counts.retokenized,
        calls_missing_ids=report.counts.missing,
        calls_failed=report.counts.calls_failed,
        lightningrl_calls=report.counts.lightningrl_calls,
        unjoined_llm_spans=report.counts.unjoined_llm_spans,
        rollouts_unreconciled=len(report.counts.unreconciled_rollouts),
        report=report,
        prompt_tokens=prompt_tokens,
        response_tokens=response_tokens,
        failures=dict(failures),
        seconds=seconds,
    )


class Evaluate(Algorithm):
    """Run a dataset through the agent and report rewards, token counts and failures.

    Uses whatever inference endpoint the gateway forwards to (``Trainer.dev`` points it at any
    OpenAI-compatible server, to check capture before a GPU run). No learning happens.

    Args:
        n_samples: rollouts per task.
        model: model name to publish in the resources (agents read ``resources.llm.model``).
        sampling: sampling parameters the gateway forces.
    """

    name = "evaluate"
    supports_policies = True  # it trains nothing; the gateway routes each call to its policy

    def __init__(
        self,
        n_samples: int = 1,
        *,
        model: str | None = None,
        sampling: Mapping[str, Any] | None = None,
        api_key: str | None = None,
    ) -> None:
        if n_samples < 1:
            raise UserError(f"n_samples must be at least 1, got {n_samples}")
        self.n_samples = n_samples
        self.model = model
        self.sampling = dict(sampling or {})
        self.api_key = api_key

    async def run(self, ctx: AlgorithmContext, train: Sequence[t.Task], val: Sequence[t.Task]) -> EvaluateResult:
        tasks = list(val) or list(train)
        if not tasks:
            raise UserError("Evaluate needs a dataset: pass it as val (or train)")
        await ctx.publish(
            t.Resources(
                llm=t.LLMEndpoint(
                    base_url=ctx.gateway_url,
                    model=self.model or "agentbolt",
                    api_key=self.api_key,
                    sampling=self.sampling,
                )
            )
        )
        started = time.monotonic()
        before = await asyncio.to_thread(ctx.gateway.stats)
        rollouts = await ctx.run_rollouts(
            tasks, group_size=self.n_samples, mode=t.RolloutMode.VAL, tag="eval", description="evaluate", step=0
        )
        all_spans: dict[str, list[t.Span]] = {}
        ids = [r.rollout_id for r in rollouts]
        for i in range(0, len(ids), 200):  # every attempt: calls of timed-out attempts count too
            all_spans.update(await ctx.store.query_spans(ids[i : i + 200]))
        after = await asyncio.to_thread(ctx.gateway.stats)
        stats = {  # this evaluation's share of the gateway's counters
            key: int(after.get(key) or 0) - int(before.get(key) or 0) for key in ("forwarded", "spans_dropped")
        }
        result = summarize(rollouts, all_spans, time.monotonic() - started, gateway_stats=stats)
        metrics: dict[str, float] = {
            "eval/gateway_calls": float(result.report.counts.reconciled_gateway_calls),
            "eval/lightningrl_calls": float(result.lightningrl_calls),
            "eval/unjoined_llm_spans": float(result.unjoined_llm_spans),
            "eval/rollouts_unreconciled": float(result.rollouts_unreconciled),
        }
        if result.reward_mean is not None:
            metrics |= {"eval/reward_mean": result.reward_mean, "eval/reward_std": result.reward_std or 0.0}
        ctx.log_metrics(0, metrics)
        if result.calls_missing_ids or result.calls_retokenized:
            log.warning(
                "%d of %d answered LLM calls have no exact token ids (%d retokenized, %d missing)",
                result.calls_missing_ids + result.calls_retokenized,
                result.llm_calls - result.calls_failed,
                result.calls_retokenized,
                result.calls_missing_ids,
            )
        if math.isnan(result.reward_mean or 0.0):
            raise AssertionError("reward mean is NaN")
        return result
