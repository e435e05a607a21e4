"""The policy update: clipped policy gradient on :class:`agentbolt.types.Transition` lists.

One :meth:`PolicyUpdater.update` call turns a batch of transitions (one per LLM call, with an
advantage computed by LightningRL) into ``epochs x mini_batches`` AdamW steps, then bumps the
policy version. It stays one module (~850 lines, over the project's 600) because the steps
below share one batch layout and are read in order; the config and metrics types open it.
Read top to bottom:

1. **Token weights** (``loss_aggregation``, a
   :class:`~agentbolt.lightningrl.LightningRLConfig` choice): core's
   :func:`agentbolt.lightningrl.aggregation.row_weights` gives each transition the weight of
   each of its response tokens (by default every rollout weighs the same, however many calls it
   made). Weights are computed per mini-batch, so gradient accumulation over micro-batches gives
   exactly the mini-batch loss.
2. **Micro-batches** packed to a padded-token budget (``micro_batch_tokens``). Sequences are
   laid out like in generation: prompts left-padded to a common length so all responses start
   at the same column, responses right-padded; ``position_ids = cumsum(mask) - 1``. Logits are
   computed only for response positions (``logits_to_keep``), which keeps memory small. With
   ``share_prompts`` (default), transitions with the same prompt (a GRPO group) are packed
   together, each distinct prompt is run once with a KV cache, and the responses run against
   the cache rows of their prompt: gradients reach the prompt's activations through the cache.
3. **Loss** per response token (``response_mask`` 1): PPO-clip
   ``max(-A r, -A clip(r, 1-eps_low, 1+eps_high))`` with ``r = exp(logp - logp_old)``, optional
   dual clip, plus ``kl_coef * KL(pi || pi_ref)`` (k1/k2/k3 estimators; the reference is the
   initial model: a frozen copy, or with LoRA the same model with adapters disabled) minus
   ``entropy_coef * entropy``.
4. **Old logprobs** (``old_logprobs``): ``"rollout"`` uses ``Transition.response_logprobs`` as
   reported by the policy server (log pi of the raw policy at temperature 1; see
   :mod:`agentbolt_torch.engine`), which corrects for staleness when rollouts ran on an older
   version; ``"recompute"`` recomputes them with the current weights before the first step
   (free when there is one optimizer step), so the first ratio is exactly 1. Transitions
   without logprobs always use recomputed ones. ``logprob_mismatch`` in the metrics is the
   mean ``|rollout - recomputed|`` logprob (the train/inference numerical gap).
5. AdamW step with gradient clipping under the policy's autocast (bf16 where fast, else fp32) and
   :attr:`Policy.lock`, so generation never runs against half-updated weights.

Checkpoints (:meth:`PolicyUpdater.save_checkpoint` / :meth:`load_checkpoint`) hold the model
(or only the LoRA adapter), the optimizer and scheduler, the update step, the policy version
and every RNG state.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import math
import os
import random
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from agentbolt.errors import UserError
from agentbolt.lightningrl import DEFAULT_LOSS_AGGREGATION, LossAggregation, check_loss_aggregation, row_weights
from agentbolt.types import Transition

from ._kv import cache_select

if TYPE_CHECKING:
    import torch

    from .policy import Policy

__all__ = ["PolicyUpdater", "UpdateConfig", "UpdateMetrics", "kl_penalty"]

logger = logging.getLogger(__name__)

KLEstimator = Literal["k1", "k2", "k3"]
_CHECKPOINT_FORMAT = 1


@dataclass(frozen=True)
class UpdateConfig:
    """Hyper-parameters of :class:`PolicyUpdater`."""

    lr: float = 1e-5
    """AdamW learning rate (LoRA usually wants ~1e-4)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    eps: float = 1e-8
    """AdamW epsilon."""
    warmup_steps: int = 0
    """Linear learning-rate warm-up over this many optimizer steps."""
    clip_ratio_low: float = 0.2
    """PPO clip: the ratio is clipped below at ``1 - clip_ratio_low``."""
    clip_ratio_high: float | None = None
    """PPO clip above at ``1 + clip_ratio_high``; ``None`` means ``clip_ratio_low`` (symmetric).
    DAPO's clip-higher uses e.g. 0.28."""
    clip_ratio_c: float | None = None
    """Dual-clip constant (> 1) bounding the loss of negative-advantage tokens; ``None`` disables."""
    kl_coef: float = 0.0
    """Weight of the KL penalty to the reference model; 0 disables it (and the reference)."""
    kl_estimator: KLEstimator = "k3"
    """``k1`` (logp - ref), ``k2`` (half squared difference) or ``k3`` (low-variance, >= 0)."""
    entropy_coef: float = 0.0
    """Entropy bonus weight (0: entropy is only measured)."""
    max_grad_norm: float | None = 1.0
    """Gradient clipping by global norm; ``None`` disables."""
    micro_batch_tokens: int = 2048
    """Padded tokens (rows x columns) per forward/backward pass; bounds memory. A sequence
    longer than this gets a micro-batch of its own."""
    epochs: int = 1
    """Passes over the batch per update."""
    mini_batches: int = 1
    """Optimizer steps per epoch (the batch is split by rollout)."""
    old_logprobs: Literal["rollout", "recompute"] = "rollout"
    """Where ``logp_old`` comes from (see the module doc)."""
    logit_temperature: float = 1.0
    """Divide logits by this before log-softmax (match the sampling temperature when the
    server reports ``processed`` logprobs; keep 1.0 with the default ``raw`` logprobs)."""
    gradient_checkpointing: bool = False
    """Trade compute for memory in the backward pass (turns ``share_prompts`` off)."""
    share_prompts: bool = True
    """Run each distinct prompt of a micro-batch through the model once and its responses against
    that prompt's KV cache, instead of one full sequence per transition. The samples of a GRPO
    group share their prompt, so this saves up to ``group_size`` times the prompt compute; the
    logprobs and gradients are those of separate sequences (up to float rounding). Micro-batch
    budgets then count each distinct prompt once."""
    seed: int = 0
    """Seed of the mini-batch shuffling."""
    objective: Literal["policy-gradient", "nll"] = "policy-gradient"
    """``policy-gradient``: the clipped surrogate above. ``nll``: supervised fine-tuning, the
    negative log-likelihood of the response tokens weighted by the advantage (``torch-sft`` sets
    every kept transition's advantage to 1); clipping and old logprobs play no part."""

    def __post_init__(self) -> None:
        if self.objective not in ("policy-gradient", "nll"):
            raise UserError(f"objective must be policy-gradient or nll, got {self.objective!r}")
        if self.kl_estimator not in ("k1", "k2", "k3"):
            raise UserError(f"kl_estimator must be k1, k2 or k3, got {self.kl_estimator!r}")
        if self.old_logprobs not in ("rollout", "recompute"):
            raise UserError(f"old_logprobs must be 'rollout' or 'recompute', got {self.old_logprobs!r}")
        if self.epochs < 1 or self.mini_batches < 1 or self.micro_batch_tokens < 1:
            raise UserError("epochs, mini_batches and micro_batch_tokens must be positive")
        if self.clip_ratio_c is not None and self.clip_ratio_c <= 1:
            raise UserError(f"clip_ratio_c must be > 1, got {self.clip_ratio_c}")
        if self.logit_temperature <= 0:
            raise UserError("logit_temperature must be positive")

    @property
    def clip_high(self) -> float:
        """The upper clip epsilon in effect."""
        return self.clip_ratio_low if self.clip_ratio_high is None else self.clip_ratio_high


@dataclass
class UpdateMetrics:
    """What one :meth:`PolicyUpdater.update` did (means are over response tokens)."""

    step: int
    """Update count after this update (1 for the first)."""
    policy_version: int
    """Policy version after the update."""
    loss: float
    """Total objective (pg + kl - entropy bonus), averaged over optimizer steps."""
    pg_loss: float
    """Policy-gradient part of the loss."""
    kl: float
    """Mean KL estimate to the reference (0 when ``kl_coef`` is 0 and no reference exists)."""
    entropy: float
    """Mean token entropy of the policy on the responses."""
    clip_frac: float
    """Fraction of tokens whose ratio was clipped."""
    ratio_mean: float
    """Mean importance ratio."""
    ratio_max: float
    """Largest importance ratio."""
    ppo_kl: float
    """Mean ``logp_old - logp`` (how far the policy moved from the sampling policy)."""
    logprob_mismatch: float
    """Mean ``|rollout logprob - current logprob|`` over the first optimizer step's tokens, before
    any weight changed: the train/inference numerical gap (NaN without rollout logprobs)."""
    grad_norm: float
    """Mean gradient norm before clipping."""
    lr: float
    """Learning rate of the last optimizer step."""
    advantage_mean: float
    """Mean advantage over transitions."""
    n_transitions: int
    """Transitions used."""
    n_rollouts: int
    """Distinct rollouts."""
    n_tokens: int
    """Trained response tokens (mask 1) per epoch."""
    response_len_mean: float
    """Mean response length in tokens."""
    prompt_len_mean: float
    """Mean prompt length in tokens (what the forward pass pays for besides the responses)."""
    optimizer_steps: int
    """AdamW steps taken."""
    micro_batches: int
    """Forward/backward passes."""
    tokens_per_s: float
    """Non-padding tokens (prompt + response) through forward and backward per second (with
    ``share_prompts``, a prompt shared by several transitions counts once)."""
    seconds: float
    """Wall time of the update."""
    skipped: int = 0
    """Transitions dropped (no trainable token)."""

    def as_dict(self) -> dict[str, float]:
        """The metrics as a flat dict (for :class:`~agentbolt_torch.metrics.MetricsLogger`)."""
        return dict(asdict(self))


@dataclass
class _Item:
    """One transition, prepared."""

    index: int
    rollout: str
    prompt: list[int]
    response: list[int]
    mask: list[float]
    advantage: float
    old: list[float] | None
    weight: float = 0.0
    recomputed: list[float] | None = None
    n_tokens: int = field(init=False)
    prompt_key: tuple[int, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.n_tokens = int(sum(1 for m in self.mask if m > 0))
        self.prompt_key = tuple(self.prompt)


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: KLEstimator = "k3") -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from sampled-token logprobs.

    ``k1 = logp - ref``; ``k2 = (logp - ref)^2 / 2``; ``k3 = exp(ref - logp) - (ref - logp) - 1``
    (Schulman's low-variance, always >= 0 estimator; clamped to [-10, 10] in the exponent like verl).
    All are exactly 0 when the two policies agree.
    """
    import torch

    diff = logp - ref_logp
    if estimator == "k1":
        return diff
    if estimator == "k2":
        return 0.5 * diff.square()
    if estimator == "k3":
        log_ratio = torch.clamp(-diff, min=-10.0, max=10.0)
        return torch.exp(log_ratio) - log_ratio - 1.0
    raise UserError(f"unknown KL estimator {estimator!r}")


class PolicyUpdater:
    """Updates a :class:`~agentbolt_torch.policy.Policy` from transitions (see the module doc).

    Args:
        policy: the shared policy; its trainable parameters are optimized in place.
        config: hyper-parameters.
        loss_aggregation: how token losses are weighted: the
            :class:`~agentbolt.lightningrl.LightningRLConfig` field of the same name (the algorithm
            passes its config's; see :mod:`agentbolt.lightningrl.aggregation`).
        reference_model: the frozen reference for the KL term in full fine-tuning; by default a
            copy of the policy's model taken here (so create the updater *before*
            :meth:`load_checkpoint` when resuming, or pass the original model).
    """

    def __init__(
        self,
        policy: Policy,
        config: UpdateConfig | None = None,
        *,
        loss_aggregation: LossAggregation = DEFAULT_LOSS_AGGREGATION,
        reference_model: Any = None,
    ) -> None:
        import torch

        self.policy = policy
        self.config = config or UpdateConfig()
        self.loss_aggregation = check_loss_aggregation(loss_aggregation)
        self.step = 0
        self._params = [p for p in policy.model.parameters() if p.requires_grad]
        if not self._params:
            raise UserError("the policy has no trainable parameters")
        self.optimizer = torch.optim.AdamW(
            self._params,
            lr=self.config.lr,
            betas=self.config.betas,
            eps=self.config.eps,
            weight_decay=self.config.weight_decay,
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

    def update(self, transitions: Sequence[Transition]) -> UpdateMetrics:
        """Run ``epochs x mini_batches`` optimizer steps on ``transitions`` and bump the policy version.

        Raises:
            UserError: a transition has no advantage, mismatched logprob/mask lengths, or no
                transition has a trainable token.
        """
        import torch

        cfg = self.config
        t0 = time.perf_counter()
        items = self._prepare(transitions)
        skipped = len(transitions) - len(items)
        if not items:
            raise UserError("no transition has a trainable response token (all masks are 0)")
        policy = self.policy
        totals: dict[str, float] = dict.fromkeys(
            ("loss", "pg_loss", "kl", "entropy", "clipped", "ratio", "ppo_kl", "mismatch", "grad_norm"), 0.0
        )
        counts = {"tokens": 0, "mismatch_tokens": 0, "steps": 0, "micro": 0, "processed": 0}
        ratio_max = 0.0
        with policy.lock:
            model = policy.model
            model.train()
            if cfg.gradient_checkpointing:
                policy.base_model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            try:
                single_pass = cfg.epochs == 1 and cfg.mini_batches == 1
                needs_old = [it for it in items if it.old is None or cfg.old_logprobs == "recompute"]
                if needs_old and not single_pass:
                    self._recompute_old(needs_old)
                first_step = True
                for _ in range(cfg.epochs):
                    for mini in self._mini_batches(items):
                        weights = row_weights(
                            [it.rollout for it in mini], [it.n_tokens for it in mini], self.loss_aggregation
                        )
                        for it, w in zip(mini, weights, strict=True):
                            it.weight = w
                        self.optimizer.zero_grad(set_to_none=True)
                        step_loss = 0.0
                        for micro in self._micro_batches(mini):
                            stats = self._forward_backward(micro, measure_mismatch=first_step)
                            step_loss += stats["loss"]
                            for key in ("pg_loss", "kl", "entropy", "clipped", "ratio", "ppo_kl", "mismatch"):
                                totals[key] += stats[key]
                            counts["tokens"] += int(stats["tokens"])
                            counts["mismatch_tokens"] += int(stats["mismatch_tokens"])
                            counts["processed"] += int(stats["processed"])
                            counts["micro"] += 1
                            ratio_max = max(ratio_max, stats["ratio_max"])
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
                if cfg.gradient_checkpointing:
                    policy.base_model.gradient_checkpointing_disable()
                model.eval()
            self.step += 1
            policy.mark_weights_changed()
            version = policy.bump_version()
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
        )

    def compute_logprobs(self, transitions: Sequence[Transition]) -> list[list[float]]:
        """Logprobs of each transition's response tokens under the current policy (no update)."""
        import torch

        items = self._prepare(transitions, require_advantage=False, keep_empty=True)
        out: dict[int, list[float]] = {}
        with self.policy.lock, torch.no_grad():
            for micro in self._micro_batches(items):
                logp, _, _ = self._logprobs(self.policy.model, micro, with_entropy=False)
                for it, row in zip(micro, logp, strict=True):
                    out[it.index] = row[: len(it.response)].tolist()
        return [out[i] for i in range(len(items))]

    # -- preparation -----------------------------------------------------------------------------

    def _prepare(
        self, transitions: Sequence[Transition], *, require_advantage: bool = True, keep_empty: bool = False
    ) -> list[_Item]:
        limit = self.policy.max_model_len
        items: list[_Item] = []
        for i, t in enumerate(transitions):
            where = f"transition {i} (rollout {t.rollout_id}, call {t.index})"
            if not t.response_ids:
                if keep_empty:
                    items.append(_Item(i, t.rollout_id, list(t.prompt_ids), [], [], 0.0, None))
                continue
            if not t.prompt_ids:
                raise UserError(f"{where} has no prompt tokens")
            if require_advantage and t.advantage is None:
                raise UserError(f"{where} has no advantage; compute advantages (LightningRL) before updating")
            if t.response_logprobs is not None and len(t.response_logprobs) != len(t.response_ids):
                raise UserError(
                    f"{where}: {len(t.response_logprobs)} logprobs for {len(t.response_ids)} response tokens"
                )
            mask = [float(m) for m in (t.response_mask or [1] * len(t.response_ids))]
            if len(mask) != len(t.response_ids):
                raise UserError(f"{where}: response_mask has {len(mask)} entries for {len(t.response_ids)} tokens")
            if len(t.prompt_ids) + len(t.response_ids) > limit:
                raise UserError(
                    f"{where} has {len(t.prompt_ids) + len(t.response_ids)} tokens, more than the context ({limit})"
                )
            item = _Item(
                index=i,
                rollout=t.rollout_id,
                prompt=list(t.prompt_ids),
                response=list(t.response_ids),
                mask=mask,
                advantage=float(t.advantage or 0.0),
                old=list(t.response_logprobs) if t.response_logprobs is not None else None,
            )
            if item.n_tokens == 0 and not keep_empty:
                continue
            items.append(item)
        return items

    def _mini_batches(self, items: list[_Item]) -> list[list[_Item]]:
        k = self.config.mini_batches
        if k == 1:
            return [items]
        rollouts = sorted({it.rollout for it in items})
        self._rng.shuffle(rollouts)
        groups = [set(rollouts[j::k]) for j in range(k)]
        batches = [[it for it in items if it.rollout in g] for g in groups]
        return [b for b in batches if b]

    @property
    def _sharing(self) -> bool:
        return self.config.share_prompts and not self.config.gradient_checkpointing

    def _micro_batches(self, items: list[_Item]) -> list[list[_Item]]:
        """Pack items into micro-batches of at most ``micro_batch_tokens`` padded tokens.

        Sorted by prompt length, then prompt (so a group's samples are neighbours), then response
        length. The cost of a micro-batch is ``rows x (P + R)``, or with prompt sharing
        ``distinct prompts x P + rows x R``.
        """
        budget = self.config.micro_batch_tokens
        sharing = self._sharing
        ordered = sorted(items, key=lambda it: (len(it.prompt), it.prompt_key, len(it.response)))
        batches: list[list[_Item]] = []
        current: list[_Item] = []
        prompts: set[tuple[int, ...]] = set()
        max_p = max_r = 0
        for it in ordered:
            p, r = max(max_p, len(it.prompt)), max(max_r, len(it.response))
            if sharing:
                n_prompts = len(prompts) + (it.prompt_key not in prompts)
                cost = n_prompts * p + (len(current) + 1) * r
            else:
                cost = (len(current) + 1) * (p + r)
            if current and cost > budget:
                batches.append(current)
                current, prompts, p, r = [], set(), len(it.prompt), len(it.response)
            current.append(it)
            prompts.add(it.prompt_key)
            max_p, max_r = p, r
        if current:
            batches.append(current)
        return batches

    # -- forward passes ------------------------------------------------------------------------

    def _batch_tensors(self, micro: list[_Item]) -> tuple[torch.Tensor, ...]:
        """Prompts left-padded to a common length P, responses right-padded to R."""
        import torch

        device = self.policy.device
        pad = self.policy.tokenizer.pad_token_id or 0
        P = max(len(it.prompt) for it in micro)
        R = max(max(len(it.response) for it in micro), 1)
        ids = torch.full((len(micro), P + R), pad, dtype=torch.long)
        attn = torch.zeros((len(micro), P + R), dtype=torch.long)
        targets = torch.full((len(micro), R), pad, dtype=torch.long)
        for i, it in enumerate(micro):
            seq = it.prompt + it.response
            start = P - len(it.prompt)
            ids[i, start : start + len(seq)] = torch.tensor(seq)
            attn[i, start : start + len(seq)] = 1
            if it.response:
                targets[i, : len(it.response)] = torch.tensor(it.response)
        positions = (attn.cumsum(-1) - 1).clamp(min=0)
        return ids.to(device), attn.to(device), positions.to(device), targets.to(device)

    def _logprobs(
        self, model: Any, micro: list[_Item], *, with_entropy: bool, entropy_grad: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None, int]:
        """Per-token logprobs [B, R] of the responses (and entropies), and tokens processed."""
        import torch

        logits, targets, processed = self._response_logits(model, micro)
        logits = logits.float()
        if self.config.logit_temperature != 1.0:
            logits = logits / self.config.logit_temperature
        log_z = torch.logsumexp(logits, dim=-1)
        logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - log_z
        entropy = None
        if with_entropy:
            ctx = contextlib.nullcontext() if entropy_grad else torch.no_grad()
            with ctx:
                probs = torch.softmax(logits, dim=-1)
                entropy = log_z - (probs * logits).sum(-1)
        return logp, entropy, processed

    def _response_logits(self, model: Any, micro: list[_Item]) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Logits [B, R, V] predicting each response token, the targets [B, R], tokens processed."""

        groups: dict[tuple[int, ...], int] = {}
        rows = [groups.setdefault(it.prompt_key, len(groups)) for it in micro]
        if not self._sharing or len(groups) == len(micro):
            ids, attn, positions, targets = self._batch_tensors(micro)
            R = targets.shape[1]
            with self.policy.autocast():
                out = model(
                    input_ids=ids, attention_mask=attn, position_ids=positions, logits_to_keep=R + 1, use_cache=False
                )
            return out.logits[:, :-1, :], targets, int(attn.sum())
        return self._shared_prompt_logits(model, micro, list(groups), rows)

    def _shared_prompt_logits(
        self, model: Any, micro: list[_Item], prompts: list[tuple[int, ...]], rows: list[int]
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Like the plain pass, but each distinct prompt runs once and responses use its KV cache.

        Pass 1: the distinct ``prompts``, left-padded to P, with a fresh cache; the last
        position's logits predict every response's first token. The cache rows are then
        repeated to one per transition (``prompts[rows[i]]`` is transition i's prompt). Pass 2: the
        responses minus their last token, right-padded, attend to their prompt's cache rows
        (mask = prompt mask + response mask, positions continue from each prompt's length).
        """
        import torch
        from transformers import DynamicCache

        device = self.policy.device
        pad = self.policy.tokenizer.pad_token_id or 0
        n_prompts = len(prompts)
        P = max(len(p) for p in prompts)
        R = max(max(len(it.response) for it in micro), 1)
        prompt_ids = torch.full((n_prompts, P), pad, dtype=torch.long)
        prompt_mask = torch.zeros((n_prompts, P), dtype=torch.long)
        for g, prompt in enumerate(prompts):
            prompt_ids[g, P - len(prompt) :] = torch.tensor(prompt)
            prompt_mask[g, P - len(prompt) :] = 1
        prompt_positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
        response_ids = torch.full((len(micro), R), pad, dtype=torch.long)
        response_mask = torch.zeros((len(micro), R), dtype=torch.long)
        for i, it in enumerate(micro):
            response_ids[i, : len(it.response)] = torch.tensor(it.response)
            response_mask[i, : len(it.response)] = 1
        index = torch.tensor(rows, device=device)
        prompt_mask = prompt_mask.to(device)
        cache = DynamicCache(config=self.policy.base_model.config)
        with self.policy.autocast():
            out = model(
                input_ids=prompt_ids.to(device),
                attention_mask=prompt_mask,
                position_ids=prompt_positions.to(device),
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
            logits = out.logits[:, -1:, :].index_select(0, index)
            if R > 1:
                cache_select(cache, index)
                lengths = prompt_mask.sum(-1).index_select(0, index)
                inputs, inputs_mask = response_ids[:, :-1].to(device), response_mask[:, :-1].to(device)
                positions = lengths[:, None] + torch.arange(R - 1, device=device)[None, :]
                out = model(
                    input_ids=inputs,
                    attention_mask=torch.cat([prompt_mask.index_select(0, index), inputs_mask], dim=1),
                    position_ids=positions,
                    past_key_values=cache,
                    use_cache=True,
                )
                logits = torch.cat([logits, out.logits], dim=1)
        processed = sum(len(p) for p in prompts) + int(response_mask.sum())
        return logits, response_ids.to(device), processed

    def _recompute_old(self, items: list[_Item]) -> None:
        import torch

        with torch.no_grad():
            for micro in self._micro_batches(items):
                logp, _, _ = self._logprobs(self.policy.model, micro, with_entropy=False)
                for it, row in zip(micro, logp, strict=True):
                    it.recomputed = row[: len(it.response)].tolist()

    def _reference_logprobs(self, micro: list[_Item]) -> torch.Tensor:
        import torch

        with torch.no_grad():
            if self.policy.is_lora:
                with self.policy.reference() as ref:
                    logp, _, _ = self._logprobs(ref, micro, with_entropy=False)
            else:
                logp, _, _ = self._logprobs(self._reference, micro, with_entropy=False)
        return logp

    def _forward_backward(self, micro: list[_Item], *, measure_mismatch: bool) -> dict[str, float]:
        import torch

        cfg = self.config
        device = self.policy.device
        R = max(max(len(it.response) for it in micro), 1)
        shape = (len(micro), R)
        mask = torch.zeros(shape, device=device)
        weight = torch.zeros(shape, device=device)
        adv = torch.zeros(shape, device=device)
        old = torch.zeros(shape, device=device)
        rollout_old = torch.zeros(shape, device=device)
        has_rollout_old = torch.zeros(shape, dtype=torch.bool, device=device)
        use_current = torch.zeros(shape, dtype=torch.bool, device=device)
        for i, it in enumerate(micro):
            n = len(it.response)
            mask[i, :n] = torch.tensor(it.mask)
            weight[i, :n] = it.weight
            adv[i, :n] = it.advantage
            if it.old is not None:
                rollout_old[i, :n] = torch.tensor(it.old)
                has_rollout_old[i, :n] = True
            source = it.old if cfg.old_logprobs == "rollout" and it.old is not None else it.recomputed
            if source is None:  # one optimizer step: the current logprobs (detached) are the old ones
                use_current[i, :n] = True
            else:
                old[i, :n] = torch.tensor(source)
        logp, entropy, processed = self._logprobs(
            self.policy.model, micro, with_entropy=True, entropy_grad=cfg.entropy_coef > 0
        )
        assert entropy is not None
        old = torch.where(use_current, logp.detach(), old)
        valid = mask > 0
        log_ratio = torch.where(valid, logp - old, torch.zeros_like(logp))
        ratio = torch.exp(log_ratio)
        pg1 = -adv * ratio
        pg2 = -adv * torch.clamp(ratio, 1.0 - cfg.clip_ratio_low, 1.0 + cfg.clip_high)
        pg = torch.maximum(pg1, pg2)
        clipped = (pg2 > pg1) & valid
        if cfg.clip_ratio_c is not None:
            pg3 = -adv * cfg.clip_ratio_c
            pg = torch.where(adv < 0, torch.minimum(pg, pg3), pg)
        if cfg.objective == "nll":
            pg = -adv * logp
            clipped = torch.zeros_like(valid)
        w = weight * mask
        pg_loss = (pg * w).sum()
        loss = pg_loss
        kl_sum = torch.zeros((), device=device)
        if cfg.kl_coef > 0:
            kl = kl_penalty(logp, self._reference_logprobs(micro), cfg.kl_estimator) * mask
            loss = loss + cfg.kl_coef * (kl * weight).sum()
            kl_sum = kl.detach().sum()
        if cfg.entropy_coef > 0:
            loss = loss - cfg.entropy_coef * (entropy * w).sum()
        loss.backward()
        with torch.no_grad():
            measured = valid & has_rollout_old if measure_mismatch else torch.zeros_like(valid)
            current = logp.detach()
            return {
                "loss": float(loss.detach()),
                "pg_loss": float(pg_loss.detach()),
                "kl": float(kl_sum),
                "entropy": float((entropy.detach() * mask).sum()),
                "clipped": float(clipped.sum()),
                "ratio": float((ratio.detach() * mask).sum()),
                "ratio_max": float(ratio.detach().masked_fill(~valid, 0).max()),
                "ppo_kl": float((-log_ratio.detach() * mask).sum()),
                "mismatch": float(((current - rollout_old).abs() * measured).sum()),
                "mismatch_tokens": float(measured.sum()),
                "tokens": float(valid.sum()),
                "processed": processed,
            }

    # -- checkpoints -----------------------------------------------------------------------------

    def save_checkpoint(self, path: str | os.PathLike[str]) -> Path:
        """Write a checkpoint directory atomically (replacing one at ``path``).

        Contents: ``model/`` (full weights, a loadable Hugging Face directory with the
        tokenizer) or ``adapter/`` (LoRA adapter only), ``optimizer.pt`` (optimizer and
        scheduler), ``rng.pt`` and ``state.json`` (step, policy version, config).
        """
        import numpy as np
        import torch

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
        try:
            with self.policy.lock:
                if self.policy.is_lora:
                    self.policy.model.save_pretrained(tmp / "adapter")
                else:
                    self.policy.model.save_pretrained(tmp / "model")
                    self.policy.tokenizer.save_pretrained(tmp / "model")
                torch.save(
                    {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()},
                    tmp / "optimizer.pt",
                )
                torch.save(
                    {
                        "torch": torch.get_rng_state(),
                        "python": random.getstate(),
                        "numpy": np.random.get_state(),
                        "updater": self._rng.getstate(),
                    },
                    tmp / "rng.pt",
                )
                state = {
                    "format": _CHECKPOINT_FORMAT,
                    "step": self.step,
                    "policy_version": self.policy.version,
                    "lora": self.policy.is_lora,
                    "config": asdict(self.config),
                    "loss_aggregation": self.loss_aggregation,
                    "saved_at": time.time(),
                }
            (tmp / "state.json").write_text(json.dumps(state, indent=2, default=str))
            tmp.chmod(0o755)
            if path.exists():
                old = path.with_name(f".{path.name}.old-{os.getpid()}")
                path.rename(old)
                tmp.rename(path)
                shutil.rmtree(old, ignore_errors=True)
            else:
                tmp.rename(path)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        logger.info("checkpoint saved to %s (step %d, policy version %d)", path, self.step, self.policy.version)
        return path

    def load_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Restore weights (or adapter), optimizer, scheduler, step, policy version and RNG states."""
        import numpy as np
        import torch
        from safetensors.torch import load_file

        path = Path(path)
        state_file = path / "state.json"
        if not state_file.is_file():
            raise UserError(f"{path} is not an agentbolt-torch checkpoint (no state.json)")
        state = json.loads(state_file.read_text())
        if bool(state.get("lora")) != self.policy.is_lora:
            kind = "a LoRA" if state.get("lora") else "a full-model"
            raise UserError(f"{path} is {kind} checkpoint; build the Policy with matching lora settings")
        with self.policy.lock:
            if self.policy.is_lora:
                from peft import set_peft_model_state_dict

                weights = load_file(str(path / "adapter" / "adapter_model.safetensors"))
                result = set_peft_model_state_dict(self.policy.model, weights)
                unexpected = getattr(result, "unexpected_keys", [])
                if unexpected:
                    raise UserError(f"adapter in {path} does not match the policy: unexpected {unexpected[:3]}")
            else:
                weights = {}
                for file in sorted((path / "model").glob("*.safetensors")):
                    weights.update(load_file(str(file)))
                model = self.policy.base_model
                missing, unexpected = model.load_state_dict(weights, strict=False)
                tied = (
                    {k for k in missing if "lm_head" in k}
                    if getattr(model.config, "tie_word_embeddings", False)
                    else set()
                )
                if unexpected or set(missing) - tied:
                    raise UserError(
                        f"weights in {path} do not match the policy: missing {sorted(set(missing) - tied)[:3]}, "
                        f"unexpected {sorted(unexpected)[:3]}"
                    )
            opt = torch.load(path / "optimizer.pt", map_location=self.policy.device, weights_only=False)
            self.optimizer.load_state_dict(opt["optimizer"])
            self.scheduler.load_state_dict(opt["scheduler"])
            rng = torch.load(path / "rng.pt", weights_only=False)
            torch.set_rng_state(rng["torch"])
            random.setstate(rng["python"])
            np.random.set_state(rng["numpy"])
            self._rng.setstate(rng["updater"])
            self.step = int(state["step"])
            self.policy.mark_weights_changed()
            self.policy.set_version(int(state["policy_version"]))
        logger.info("resumed from %s (step %d, policy version %d)", path, self.step, self.policy.version)
