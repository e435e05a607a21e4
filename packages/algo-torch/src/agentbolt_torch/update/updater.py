"""The policy update: clipped policy gradient on :class:`agentbolt.types.Transition` lists.

One :meth:`PolicyUpdater.update` call turns a batch of LightningRL's training rows
(:class:`~agentbolt.lightningrl.TrainingRow`: one per LLM call, with the advantage and loss
weight LightningRL decided) into ``epochs x mini_batches`` AdamW steps, then bumps the policy
version. This module is the loop, read top to bottom; each step's details live in a
module of its own:

1. **Preparation and batches** (:mod:`.batches`): transitions are checked, split by
   rollout into mini-batches (one optimizer step each) and packed into micro-batches to a
   padded-token budget (``micro_batch_tokens``), the samples of one prompt kept together.
2. **Token weights** (``loss_aggregation``, a
   :class:`~agentbolt.lightningrl.LightningRLConfig` choice): core's
   :func:`agentbolt.lightningrl.token_loss_weights` gives each row the weight of each of its
   response tokens (by default every rollout weighs the same, however many calls it made).
   Weights are computed per mini-batch, so gradient accumulation over micro-batches gives
   exactly the mini-batch loss; with one mini-batch they are the rows' ``loss_weight``.
   **Off-policy correction** (``correction``, the config's ``rollout_is`` / ``rollout_rs``):
   before the first step the proximal logprobs are recomputed with the current weights, core's
   :func:`~agentbolt.lightningrl.rollout_correction` turns behaviour vs proximal into per-token IS
   weights and rejection masks, and the PPO ratio is taken against the proximal logprobs
   (verl's decoupled mode: three policies).
   **Rows without a gradient** (``skip_zero_advantage``): with no KL or entropy term, a row of
   advantage exactly 0 (a GRPO group whose samples all scored alike) adds ``-0 x ratio`` per
   token, so it is left out of the passes below (after its mini-batch's token weights are set);
   a mini-batch of such rows only steps AdamW with zero gradients, as it would have.
3. **Forward pass** (:mod:`.forward`): per-token logprobs of the responses, computed
   only at response positions; with ``share_prompts`` (default) each distinct prompt of a
   micro-batch runs once with a KV cache and its responses run against the cache.
4. **Loss** (:mod:`.loss`) per response token: PPO-clip with optional dual clip (or the
   NLL of ``torch-sft``), plus ``kl_coef * KL(pi || pi_ref)`` (the reference is the initial
   model: a frozen copy, or with LoRA the same model with adapters disabled) minus
   ``entropy_coef * entropy``.
5. **Old logprobs** (``old_logprobs``; ``"auto"``: ``"recompute"`` under correction, else
   ``"rollout"``): ``"rollout"`` uses the rows' behaviour logprobs as reported by the policy server (log pi of the raw policy at temperature 1; see
   :mod:`agentbolt_torch.generation.engine`), which corrects for staleness when rollouts ran on an older
   version; ``"recompute"`` recomputes them with the current weights before the first step
   (free when there is one optimizer step), so the first ratio is exactly 1. Transitions
   without logprobs always use recomputed ones. ``logprob_mismatch`` in the metrics is the
   mean ``|rollout - recomputed|`` logprob (the train/inference numerical gap).
6. AdamW step (the fused implementation where the parameters allow it: no model-sized
   temporaries) with gradient clipping under the policy's autocast (bf16 where fast, else fp32) and
   :attr:`Policy.lock`, so generation never runs against half-updated weights.

Before and after each update the allocator's free pages go back to the operating system
(:func:`agentbolt_torch.allocator.release_free_memory`; tcmalloc only), so neither the update nor
the generation after it grows the process by what the other phase freed.

Every update (and :meth:`PolicyUpdater.compute_logprobs`) runs on the policy's training thread
(:meth:`Policy.on_training_thread`), whichever thread calls it: memory allocators keep a
thread's freed memory for that thread (glibc's per-thread arenas), so updates on varying threads
(``asyncio.to_thread``) each kept an update's activations (see docs/benchmarks.md, "Update memory").

Hyper-parameters and metrics are :mod:`.config` (:class:`UpdateConfig`,
:class:`UpdateMetrics`, re-exported here). Checkpoints (:meth:`PolicyUpdater.save_checkpoint` /
:meth:`PolicyUpdater.load_checkpoint`, :mod:`.checkpoint`) hold the model (or only the
LoRA adapter), the optimizer and scheduler, the update step, the policy version and every RNG
state.
"""

from __future__ import annotations

import copy
import logging
import math
import os
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentbolt.errors import UserError
from agentbolt.lightningrl import (
    DEFAULT_LOSS_AGGREGATION,
    LossAggregation,
    RolloutCorrection,
    TrainingRow,
    check_loss_aggregation,
    training_rows,
)
from agentbolt.types import Transition

from ..adapters import activate, adapter_parameters
from ..allocator import release_free_memory
from . import checkpoint as update_checkpoint
from .batches import (
    PreparedTransition,
    apply_correction,
    assign_token_weights,
    micro_batches,
    mini_batches,
    prepare_items,
)
from .config import UpdateConfig, UpdateMetrics
from .forward import response_logprobs
from .loss import kl_penalty, policy_loss
from .recompute import checkpointed_layers

if TYPE_CHECKING:
    import torch

    from ..policy import Policy

__all__ = ["PolicyUpdater", "UpdateConfig", "UpdateMetrics", "kl_penalty"]

logger = logging.getLogger(__name__)


class PolicyUpdater:
    """Updates a :class:`~agentbolt_torch.policy.Policy` from transitions (see the module doc).

    Args:
        policy: the shared policy; its trainable parameters are optimized in place.
        config: hyper-parameters.
        loss_aggregation: how token losses are weighted: the
            :class:`~agentbolt.lightningrl.LightningRLConfig` field of the same name (the algorithm
            passes its config's; see :mod:`agentbolt.lightningrl.aggregation`).
        correction: off-policy correction, the config's
            :attr:`~agentbolt.lightningrl.LightningRLConfig.correction` (``None``: off).
        reference_model: the frozen reference for the KL term in full fine-tuning; by default a
            copy of the policy's model taken here (so create the updater *before*
            :meth:`load_checkpoint` when resuming, or pass the original model).
        adapter: with a policy of several adapters (policies by role), the one this updater
            trains: only its parameters are optimized, it is the active adapter during the
            update, and only its version is bumped (:mod:`agentbolt_torch.adapters`).
    """

    def __init__(
        self,
        policy: Policy,
        config: UpdateConfig | None = None,
        *,
        loss_aggregation: LossAggregation = DEFAULT_LOSS_AGGREGATION,
        correction: RolloutCorrection | None = None,
        reference_model: Any = None,
        adapter: str | None = None,
    ) -> None:
        import torch

        if policy.adapters and adapter is None:
            raise UserError(f"the policy has adapters {list(policy.adapters)}: pass adapter= (the one to train)")
        if adapter is not None:
            policy.version_of(adapter)  # raises for an unknown adapter
        self.policy = policy
        self.adapter = adapter
        self.config = config or UpdateConfig()
        self.loss_aggregation = check_loss_aggregation(loss_aggregation)
        self.correction = correction if correction is not None and correction.enabled else None
        if self.correction is not None and self.config.old_logprobs == "rollout":
            raise UserError(
                "old_logprobs='rollout' takes the PPO ratio against the sampling policy, which off-policy "
                "correction (rollout_is / rollout_rs) already weighs: use old_logprobs='auto' or 'recompute'"
            )
        if self.correction is not None and self.config.objective == "nll":
            raise UserError("off-policy correction applies to the policy-gradient objective, not to 'nll' (SFT)")
        self.old_logprobs = "recompute" if self.correction is not None else self.config.old_logprobs
        if self.old_logprobs == "auto":
            self.old_logprobs = "rollout"
        self.step = 0
        self._params = (
            adapter_parameters(policy.model, adapter)
            if adapter is not None
            else [p for p in policy.model.parameters() if p.requires_grad]
        )
        if not self._params:
            raise UserError("the policy has no trainable parameters")
        # fused: one kernel per parameter, no temporaries the size of the whole model (the default
        # multi-tensor path allocates several per step: ~1 GB of transient memory for 135M params)
        fused = all(p.dtype.is_floating_point and p.device.type in ("cpu", "cuda") for p in self._params)
        self.optimizer = torch.optim.AdamW(
            self._params,
            lr=self.config.lr,
            betas=self.config.betas,
            eps=self.config.eps,
            weight_decay=self.config.weight_decay,
            fused=fused or None,
        )
        warmup = self.config.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup > 0 else 1.0
        )
        self._rng = random.Random(self.config.seed)
        self._reference: Any = None
        if self.config.kl_coef > 0 and not policy.is_lora:
            self._reference = reference_model if reference_model is not None else copy.deepcopy(policy.model)
            self._reference.requires_grad_(False)
            self._reference.eval()

    @property
    def trainable_parameters(self) -> int:
        """Number of trained parameters."""
        return sum(p.numel() for p in self._params)

    # -- public API ------------------------------------------------------------------------------

    def update(self, rows: Sequence[TrainingRow] | Sequence[Transition]) -> UpdateMetrics:
        """Run ``epochs x mini_batches`` optimizer steps on ``rows`` and bump the policy version.

        Args:
            rows: LightningRL's training rows (``LightningRL(config).process(...).rows``), or
                transitions with advantages (turned into rows with core's
                :func:`~agentbolt.lightningrl.training_rows` and this updater's aggregation).

        Raises:
            UserError: a transition has no advantage, mismatched logprob/mask lengths, no row has
                a trainable token, or correction without behaviour logprobs.
        """
        return self.policy.on_training_thread(self._update, rows)

    def _update(self, rows: Sequence[TrainingRow] | Sequence[Transition]) -> UpdateMetrics:
        import torch

        cfg = self.config
        t0 = time.perf_counter()
        batch = [r for r in rows if isinstance(r, TrainingRow)]
        if len(batch) != len(rows):
            batch = training_rows([r for r in rows if isinstance(r, Transition)], self.loss_aggregation)
            if len(batch) != len(rows):
                raise UserError("update() takes TrainingRow s or Transition s, not a mixture or other objects")
        items = self._prepare(batch)
        skipped = len(rows) - len(items)
        if not items:
            raise UserError("no transition has a trainable response token (all masks are 0)")
        policy = self.policy
        release_free_memory()  # start from what is in use, not from generation's freed pages
        totals: dict[str, float] = dict.fromkeys(
            ("loss", "pg_loss", "kl", "entropy", "clipped", "ratio", "ppo_kl", "mismatch", "grad_norm"), 0.0
        )
        counts = {"tokens": 0, "mismatch_tokens": 0, "steps": 0, "micro": 0, "processed": 0, "zero_advantage": 0}
        ratio_max = 0.0
        correction: dict[str, float] = {}
        with policy.lock:
            model = policy.model
            self._activate()
            model.train()
            try:
                single_pass = cfg.epochs == 1 and cfg.mini_batches == 1
                needs_old = [it for it in items if it.old is None or self.old_logprobs == "recompute"]
                if needs_old and (not single_pass or self.correction is not None):
                    self._recompute_old(needs_old)
                if self.correction is not None:
                    items, correction = apply_correction(items, self.correction)
                first_step = True
                for epoch in range(cfg.epochs):
                    for mini in self._mini_batches(items):
                        assign_token_weights(mini, self.loss_aggregation)
                        with_gradient = self._rows_with_gradient(mini)
                        if epoch == 0:
                            counts["zero_advantage"] += len(mini) - len(with_gradient)
                        self.optimizer.zero_grad(set_to_none=True)
                        step_loss = 0.0
                        for micro in self._micro_batches(with_gradient):
                            stats = self._forward_backward(micro, measure_mismatch=first_step)
                            step_loss += stats["loss"]
                            for key in ("pg_loss", "kl", "entropy", "clipped", "ratio", "ppo_kl", "mismatch"):
                                totals[key] += stats[key]
                            counts["tokens"] += int(stats["tokens"])
                            counts["mismatch_tokens"] += int(stats["mismatch_tokens"])
                            counts["processed"] += int(stats["processed"])
                            counts["micro"] += 1
                            ratio_max = max(ratio_max, stats["ratio_max"])
                        if not with_gradient:  # every gradient is exactly 0; AdamW's moments still move
                            for p in self._params:
                                p.grad = torch.zeros_like(p)
                        if cfg.max_grad_norm is not None:
                            norm = torch.nn.utils.clip_grad_norm_(self._params, cfg.max_grad_norm)
                        else:
                            norm = torch.linalg.vector_norm(
                                torch.stack([p.grad.norm() for p in self._params if p.grad is not None])
                            )
                        norm_value = float(norm)
                        if not math.isfinite(norm_value):
                            logger.warning("non-finite gradient norm (%s); skipping this optimizer step", norm_value)
                            self.optimizer.zero_grad(set_to_none=True)
                        else:
                            self.optimizer.step()
                            self.scheduler.step()
                        self.optimizer.zero_grad(set_to_none=True)
                        first_step = False
                        totals["loss"] += step_loss
                        totals["grad_norm"] += norm_value
                        counts["steps"] += 1
            finally:
                model.eval()
            self.step += 1
            policy.mark_weights_changed()
            version = policy.bump_version(self.adapter)
        release_free_memory()  # and leave generation what the update freed
        seconds = time.perf_counter() - t0
        tokens = max(counts["tokens"], 1)
        steps = max(counts["steps"], 1)
        return UpdateMetrics(
            step=self.step,
            policy_version=version,
            loss=totals["loss"] / steps,
            pg_loss=totals["pg_loss"] / steps,
            kl=totals["kl"] / tokens,
            entropy=totals["entropy"] / tokens,
            clip_frac=totals["clipped"] / tokens,
            ratio_mean=totals["ratio"] / tokens,
            ratio_max=ratio_max,
            ppo_kl=totals["ppo_kl"] / tokens,
            logprob_mismatch=(
                totals["mismatch"] / counts["mismatch_tokens"] if counts["mismatch_tokens"] else float("nan")
            ),
            grad_norm=totals["grad_norm"] / steps,
            lr=float(self.optimizer.param_groups[0]["lr"]),
            advantage_mean=sum(it.advantage for it in items) / len(items),
            n_transitions=len(items),
            n_rollouts=len({it.rollout for it in items}),
            n_tokens=sum(it.n_tokens for it in items),
            response_len_mean=sum(len(it.response) for it in items) / len(items),
            prompt_len_mean=sum(len(it.prompt) for it in items) / len(items),
            optimizer_steps=counts["steps"],
            micro_batches=counts["micro"],
            tokens_per_s=counts["processed"] / seconds if seconds > 0 else 0.0,
            seconds=seconds,
            skipped=skipped,
            zero_advantage_skipped=counts["zero_advantage"],
            is_weight_mean=correction.get("is_weight_mean", float("nan")),
            is_weight_max=correction.get("is_weight_max", float("nan")),
            is_clipped_frac=correction.get("is_clipped_frac", float("nan")),
            rs_masked_frac=correction.get("rs_masked_frac", float("nan")),
        )

    def compute_logprobs(self, transitions: Sequence[Transition]) -> list[list[float]]:
        """Logprobs of each transition's response tokens under the current policy (no update)."""
        return self.policy.on_training_thread(self._compute_logprobs, transitions)

    def _compute_logprobs(self, transitions: Sequence[Transition]) -> list[list[float]]:
        import torch

        items = self._prepare(transitions, keep_empty=True)
        out: dict[int, list[float]] = {}
        with self.policy.lock, torch.no_grad():
            self._activate()
            for micro in self._micro_batches(items):
                logp, _, _ = self._logprobs(self.policy.model, micro, with_entropy=False)
                for it, row in zip(micro, logp, strict=True):
                    out[it.index] = row[: len(it.response)].tolist()
        return [out[i] for i in range(len(items))]

    # -- the pieces, bound to this updater's policy and config --------------------------------------

    def _activate(self) -> None:
        """With several adapters: make this updater's the one forward passes use (under the lock)."""
        if self.adapter is not None:
            activate(self.policy.model, self.adapter)

    def _prepare(
        self, rows: Sequence[TrainingRow] | Sequence[Transition], *, keep_empty: bool = False
    ) -> list[PreparedTransition]:
        return prepare_items(rows, self.policy.max_model_len, keep_empty=keep_empty)

    def _mini_batches(self, items: list[PreparedTransition]) -> list[list[PreparedTransition]]:
        return mini_batches(items, self.config.mini_batches, self._rng)

    def _rows_with_gradient(self, mini: list[PreparedTransition]) -> list[PreparedTransition]:
        """The rows of ``mini`` whose loss has a gradient (:attr:`UpdateConfig.skip_zero_advantage`):
        with no KL or entropy term, a row of advantage exactly 0 contributes ``-0 x ratio`` per token."""
        cfg = self.config
        if not cfg.skip_zero_advantage or cfg.kl_coef > 0 or cfg.entropy_coef > 0:
            return mini
        return [it for it in mini if it.advantage != 0.0]

    @property
    def _sharing(self) -> bool:
        return self.config.share_prompts

    def _micro_batches(self, items: list[PreparedTransition]) -> list[list[PreparedTransition]]:
        return micro_batches(items, self.config.micro_batch_tokens, share_prompts=self._sharing)

    def _logprobs(
        self, model: Any, micro: list[PreparedTransition], *, with_entropy: bool, entropy_grad: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None, int]:
        return response_logprobs(
            self.policy,
            model,
            micro,
            share_prompts=self._sharing,
            logit_temperature=self.config.logit_temperature,
            with_entropy=with_entropy,
            entropy_grad=entropy_grad,
        )

    def _recompute_old(self, items: list[PreparedTransition]) -> None:
        import torch

        with torch.no_grad():
            for micro in self._micro_batches(items):
                logp, _, _ = self._logprobs(self.policy.model, micro, with_entropy=False)
                for it, row in zip(micro, logp, strict=True):
                    it.recomputed = row[: len(it.response)].tolist()

    def _reference_logprobs(self, micro: list[PreparedTransition]) -> torch.Tensor:
        import torch

        with torch.no_grad():
            if self.policy.is_lora:
                with self.policy.reference() as ref:
                    logp, _, _ = self._logprobs(ref, micro, with_entropy=False)
            else:
                logp, _, _ = self._logprobs(self._reference, micro, with_entropy=False)
        return logp

    def _forward_backward(self, micro: list[PreparedTransition], *, measure_mismatch: bool) -> dict[str, float]:
        cfg = self.config
        with checkpointed_layers(self.policy.model, cfg.gradient_checkpointing):
            logp, entropy, processed = self._logprobs(
                self.policy.model, micro, with_entropy=True, entropy_grad=cfg.entropy_coef > 0
            )
        assert entropy is not None
        ref_logp = self._reference_logprobs(micro) if cfg.kl_coef > 0 else None
        loss, stats = policy_loss(
            micro, logp, entropy, ref_logp, cfg, measure_mismatch=measure_mismatch, old_logprobs=self.old_logprobs
        )
        loss.backward()
        stats["processed"] = processed
        return stats

    # -- checkpoints -----------------------------------------------------------------------------

    @property
    def _checkpoint_target(self) -> update_checkpoint.CheckpointTarget:
        """What this updater's checkpoints hold: the policy (this updater's adapter of it), the
        optimizer and scheduler, and the mini-batch RNG."""
        return update_checkpoint.CheckpointTarget(self.policy, self.optimizer, self.scheduler, self._rng, self.adapter)

    def save_checkpoint(self, path: str | os.PathLike[str]) -> Path:
        """Write a checkpoint directory atomically (replacing one at ``path``).

        Contents: ``model/`` (full weights, a loadable Hugging Face directory with the
        tokenizer) or ``adapter/`` (LoRA adapter only), ``optimizer.pt`` (optimizer and
        scheduler), ``rng.pt`` and ``state.json`` (step, policy version, config).
        """
        path = update_checkpoint.save_checkpoint(
            path, self._checkpoint_target, step=self.step, config=self.config, loss_aggregation=self.loss_aggregation
        )
        logger.info(
            "checkpoint saved to %s (step %d, policy version %d)", path, self.step, self.policy.version_of(self.adapter)
        )
        return path

    def load_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Restore weights (or adapter), optimizer, scheduler, step, policy version and RNG states."""
        state = update_checkpoint.load_checkpoint(path, self._checkpoint_target)
        self.step = int(state["step"])
        logger.info(
            "resumed from %s (step %d, policy version %d)", path, self.step, self.policy.version_of(self.adapter)
        )
