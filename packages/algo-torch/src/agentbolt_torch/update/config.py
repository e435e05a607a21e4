"""Hyper-parameters and metrics of the policy update (:class:`~agentbolt_torch.update.updater.PolicyUpdater`).

:class:`UpdateConfig` is what ``TorchGRPO(update=...)`` takes; :class:`UpdateMetrics` is what one
update reports. Both are plain data, importable without torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

from agentbolt.errors import UserError

__all__ = ["KLEstimator", "UpdateConfig", "UpdateMetrics"]

KLEstimator = Literal["k1", "k2", "k3"]
"""The KL estimators of :func:`~agentbolt_torch.update.loss.kl_penalty`."""


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
    old_logprobs: Literal["auto", "rollout", "recompute"] = "auto"
    """Where ``logp_old`` comes from (see :mod:`agentbolt_torch.update.updater`): ``auto`` is ``recompute``
    when the updater applies off-policy correction, else ``rollout``."""
    logit_temperature: float = 1.0
    """Divide logits by this before log-softmax (match the sampling temperature when the
    server reports ``processed`` logprobs; keep 1.0 with the default ``raw`` logprobs)."""
    gradient_checkpointing: bool = False
    """Trade compute for memory in the backward pass: each decoder layer keeps only its input and
    runs again in the backward pass (about one more forward pass of the layers;
    :mod:`agentbolt_torch.update.recompute`). Keeps ``share_prompts``; the update is unchanged."""
    share_prompts: bool = True
    """Run each distinct prompt of a micro-batch through the model once and its responses against
    that prompt's KV cache, instead of one full sequence per transition. The samples of a GRPO
    group share their prompt, so this saves up to ``group_size`` times the prompt compute; the
    logprobs and gradients are those of separate sequences (up to float rounding). Micro-batch
    budgets then count each distinct prompt once."""
    skip_zero_advantage: bool = True
    """Leave out of the forward and backward passes the rows whose gradient is exactly zero: an
    advantage of exactly 0 (every sample of a GRPO group scored the same) with no KL or entropy
    term (``kl_coef == entropy_coef == 0``), where each of their tokens' loss is ``-0 x ratio``.
    The optimizer step is the same (the rows' token weights are set over the whole mini-batch
    first, and a mini-batch of such rows only still steps AdamW with zero gradients); the
    per-token metrics (entropy, clip fraction, ratio, mismatch) then cover the rows that ran.
    ``UpdateMetrics.zero_advantage_skipped`` counts them. In the quickstart about 5 of 8 groups
    per step score all alike, so most of the update's compute went into zero gradients."""
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
        if self.old_logprobs not in ("auto", "rollout", "recompute"):
            raise UserError(f"old_logprobs must be 'auto', 'rollout' or 'recompute', got {self.old_logprobs!r}")
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
    zero_advantage_skipped: int = 0
    """Rows (per epoch) not run through the model because their gradient is exactly zero
    (:attr:`UpdateConfig.skip_zero_advantage`); they count in ``n_transitions``."""
    is_weight_mean: float = float("nan")
    """Off-policy correction: mean IS weight over the trained tokens (NaN without ``rollout_is``)."""
    is_weight_max: float = float("nan")
    """Off-policy correction: largest IS weight applied."""
    is_clipped_frac: float = float("nan")
    """Off-policy correction: share of tokens whose IS weight was capped (TIS) or zeroed (IcePop)."""
    rs_masked_frac: float = float("nan")
    """Off-policy correction: share of tokens masked out by rejection (NaN without ``rollout_rs``)."""

    def as_dict(self) -> dict[str, float]:
        """The metrics as a flat dict (for :class:`~agentbolt_torch.training.metrics.MetricsLogger`)."""
        return dict(asdict(self))
