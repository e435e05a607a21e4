"""The loss of the policy update, per response token: clipped policy gradient, KL penalty, entropy bonus.

Given the current logprobs of a micro-batch's responses (:mod:`agentbolt_torch.update.forward`),
:func:`policy_loss` returns the micro-batch's share of the mini-batch objective and its
statistics; the updater backpropagates it. For each response token (``response_mask`` 1), with
weight ``w`` from core's :func:`~agentbolt.lightningrl.token_loss_weights` (set per mini-batch,
so the micro-batch losses sum to the mini-batch loss; the aggregation weight times the token's
IS weight under off-policy correction):

- PPO-clip ``max(-A r, -A clip(r, 1-eps_low, 1+eps_high))`` with ``r = exp(logp - logp_old)``,
  optional dual clip (``clip_ratio_c``); or with ``objective="nll"``, ``-A logp``;
- plus ``kl_coef * KL(pi || pi_ref)`` (:func:`kl_penalty`, k1/k2/k3 estimators);
- minus ``entropy_coef * entropy``.

``logp_old`` is the row's behaviour logprobs (``old_logprobs="rollout"``), else the recomputed
(proximal) ones, else (a single optimizer step) the current logprobs detached, so the ratio is 1.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentbolt.errors import UserError

from .config import KLEstimator, UpdateConfig

if TYPE_CHECKING:
    import torch

    from .batches import PreparedTransition

__all__ = ["kl_penalty", "policy_loss"]


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


def policy_loss(
    micro: list[PreparedTransition],
    logp: torch.Tensor,
    entropy: torch.Tensor,
    ref_logp: torch.Tensor | None,
    cfg: UpdateConfig,
    *,
    measure_mismatch: bool,
    old_logprobs: str = "rollout",
) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss of one micro-batch (not yet backpropagated) and its sums for the metrics.

    Args:
        micro: the micro-batch's rows (with their mini-batch ``token_weights``).
        logp: current logprobs [B, R] of the responses (with gradients).
        entropy: token entropies [B, R] (with gradients when ``entropy_coef > 0``).
        ref_logp: the reference's logprobs [B, R]; required when ``cfg.kl_coef > 0``.
        cfg: the update's hyper-parameters.
        measure_mismatch: sum ``|rollout logprob - current logprob|`` (before any weight changed).
        old_logprobs: ``rollout`` (behaviour logprobs as the PPO old policy, when a row has them)
            or ``recompute`` (the proximal logprobs); the updater resolves ``auto``.
    """
    import torch

    device = logp.device
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
        weight[i, :n] = torch.tensor(it.token_weights) if it.token_weights else 0.0
        adv[i, :n] = it.advantage
        if it.old is not None:
            rollout_old[i, :n] = torch.tensor(it.old)
            has_rollout_old[i, :n] = True
        source = it.old if old_logprobs == "rollout" and it.old is not None else it.recomputed
        if source is None:  # one optimizer step: the current logprobs (detached) are the old ones
            use_current[i, :n] = True
        else:
            old[i, :n] = torch.tensor(source)
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
        if ref_logp is None:
            raise ValueError("policy_loss needs ref_logp when kl_coef > 0")
        kl = kl_penalty(logp, ref_logp, cfg.kl_estimator) * mask
        loss = loss + cfg.kl_coef * (kl * weight).sum()
        kl_sum = kl.detach().sum()
    if cfg.entropy_coef > 0:
        loss = loss - cfg.entropy_coef * (entropy * w).sum()
    with torch.no_grad():
        measured = valid & has_rollout_old if measure_mismatch else torch.zeros_like(valid)
        current = logp.detach()
        stats = {
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
        }
    return loss, stats
