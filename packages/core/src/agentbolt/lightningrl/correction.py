"""Off-policy correction: importance-sampling weights and rejection masks, framework-free.

A token was sampled by the **behaviour** policy (its logprob is recorded at sampling, on the
LLM-call span: ``Transition.response_logprobs``). The backend trains against a **proximal**
policy: the logprobs it recomputes with the weights it is about to update (verl's
``old_log_probs``, agentbolt-torch's recomputed old logprobs). Their per-token log ratio
``log r = proximal - behaviour`` measures how far off-policy a token is (a stale policy
version, or the numerical gap between the inference engine and the trainer). This module turns
it into per-token weights and masks, with **verl 0.9.1's names and formulas**
(``verl/trainer/ppo/rollout_corr_helper.py``; the parity tests run both on the same inputs):

- ``rollout_is="token"`` (token TIS): ``w = min(exp(clamp(log r, ±20)), C)`` per token;
- ``rollout_is="sequence"`` (sequence TIS): ``w = min(exp(clamp(Σ log r, ±20)), C)``, the same
  for every token of the row;
- ``rollout_is_threshold``: the cap ``C`` (default 2.0), or ``"lower_upper"`` (IcePop: weights
  outside ``[lower, upper]`` become 0 instead of being capped);
- ``rollout_is_batch_normalize``: divide the weights by their mean over the batch;
- ``rollout_rs`` (rejection, verl's MIS when sequence-level, e.g. ``"seq_sum_k1"``): tokens or
  whole rows whose divergence is outside ``rollout_rs_threshold`` are masked out of the loss
  (the row's tokens no longer count in the loss aggregation either). Options, comma-separated,
  all of which must pass: ``token_k1``, ``token_k2``, ``token_k3``, ``seq_sum_k{1,2,3}``,
  ``seq_mean_k{1,2,3}``, ``seq_max_k{2,3}``, with ``k1 = -log r``, ``k2 = (log r)²/2``,
  ``k3 = exp(log r) - 1 - log r`` (log r clamped to ±20). ``k1`` thresholds are ratio bounds
  ``"lower_upper"`` (a single ``T`` means ``1/T_T``), compared as ``log lower <= k1 <= log upper``;
  ``k2``/``k3`` thresholds are upper bounds.

IS weights are computed on the original mask, rejection produces a new mask; a token's loss
factor is ``w · mask'``. :func:`rollout_correction` is the one implementation: agentbolt-torch's
updater and agentbolt-verl's advantage hook both call it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from ..errors import UserError

__all__ = [
    "RS_OPTIONS",
    "SAFETY_BOUND",
    "CorrectionResult",
    "RolloutCorrection",
    "rollout_correction",
]

SAFETY_BOUND = 20.0
"""Log ratios are clamped to ``[-20, 20]`` before exponentiation (verl's ``SAFETY_BOUND``)."""

RS_OPTIONS: tuple[str, ...] = (
    "token_k1",
    "token_k2",
    "token_k3",
    "seq_sum_k1",
    "seq_sum_k2",
    "seq_sum_k3",
    "seq_mean_k1",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_max_k2",
    "seq_max_k3",
)
"""verl's rejection options (``SUPPORTED_ROLLOUT_RS_OPTIONS``)."""

_EPS = 1e-8
"""verl's ``masked_mean`` / clamp epsilon."""


def _count(n: int) -> float:
    """verl's ``masked_mean`` denominator ``mask.sum() + 1e-8`` for its integer response masks:
    the sum is promoted to float32, where ``n + 1e-8`` is ``n`` for any count ``n >= 1``."""
    return float(n) if n > 0 else _EPS


@dataclass(frozen=True)
class _Bound:
    option: str
    lower: float | None
    upper: float


def _parse_is_threshold(spec: float | str) -> tuple[float, float | None]:
    """(upper, lower) of ``rollout_is_threshold``: a cap, or ``"lower_upper"`` (IcePop)."""
    if isinstance(spec, bool):
        raise UserError("rollout_is_threshold must be a number or 'lower_upper', not a boolean")
    lower: float | None = None
    if isinstance(spec, int | float):
        upper = float(spec)
    else:
        text = str(spec).strip()
        try:
            if "_" in text:
                low_text, up_text = text.split("_", 1)
                lower, upper = float(low_text), float(up_text)
            else:
                upper = float(text)
        except ValueError:
            raise UserError(f"rollout_is_threshold {spec!r} is not a number or 'lower_upper'") from None
    if not upper > 0 or (lower is not None and not 0 < lower <= upper):
        raise UserError(f"rollout_is_threshold {spec!r}: bounds must be positive with lower <= upper")
    return upper, lower


def _parse_rs(options: str, spec: float | str | None) -> tuple[_Bound, ...]:
    """verl's ``_parse_rollout_rs_thresholds``: one bound per option (one value is shared)."""
    names = list(dict.fromkeys(o.strip() for o in options.split(",") if o.strip()))
    if not names:
        raise UserError("rollout_rs names no option; valid: " + ", ".join(RS_OPTIONS))
    unknown = [n for n in names if n not in RS_OPTIONS]
    if unknown:
        raise UserError(f"unknown rollout_rs option(s) {', '.join(unknown)}; valid: {', '.join(RS_OPTIONS)}")
    if spec is None or isinstance(spec, bool):
        raise UserError("rollout_rs needs rollout_rs_threshold (e.g. '0.5_2.0' for seq_sum_k1, 0.01 for k3 options)")
    raw = [str(spec)] if isinstance(spec, int | float) else [p.strip() for p in str(spec).split(",") if p.strip()]
    if len(raw) not in (1, len(names)):
        raise UserError(f"rollout_rs_threshold needs one value or one per option ({len(names)}), got {len(raw)}")
    if len(raw) == 1:
        raw = raw * len(names)
    bounds = []
    for name, text in zip(names, raw, strict=True):
        try:
            if name.endswith("k1"):
                low_text, up_text = text.split("_", 1) if "_" in text else (str(1.0 / float(text)), text)
                lower, upper = float(low_text), float(up_text)
                if not 0 < lower <= upper:
                    raise ValueError
                bounds.append(_Bound(name, math.log(lower), math.log(upper)))
            else:
                if "_" in text:
                    raise ValueError
                upper = float(text)
                if not upper > 0:
                    raise ValueError
                bounds.append(_Bound(name, None, upper))
        except (ValueError, ZeroDivisionError):
            form = (
                "'lower_upper' ratio bounds (or one ratio T for 1/T..T)"
                if name.endswith("k1")
                else "a positive upper bound"
            )
            raise UserError(f"rollout_rs_threshold {text!r} for {name}: expected {form}") from None
    return tuple(bounds)


@dataclass(frozen=True)
class RolloutCorrection:
    """The off-policy correction settings (verl's ``algorithm.rollout_correction`` names).

    Built by :attr:`~agentbolt.lightningrl.LightningRLConfig.correction` from the config's
    fields of the same names; validated on construction (:class:`UserError` naming the field).
    """

    rollout_is: Literal["token", "sequence"] | None = None
    """Importance-sampling level: ``token`` (token TIS), ``sequence`` (sequence TIS) or ``None``."""
    rollout_is_threshold: float | str = 2.0
    """TIS cap, or ``"lower_upper"`` (IcePop)."""
    rollout_is_batch_normalize: bool = False
    """Normalize the IS weights to mean 1 over the batch."""
    rollout_rs: str | None = None
    """Rejection (masking) options, comma-separated (``seq_sum_k1`` is verl's sequence MIS)."""
    rollout_rs_threshold: float | str | None = None
    """Rejection bounds (one value, or one per option)."""
    _is_bounds: tuple[float, float | None] = field(init=False, repr=False, compare=False)
    _rs_bounds: tuple[_Bound, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.rollout_is not in (None, "token", "sequence"):
            raise UserError(f"rollout_is must be 'token', 'sequence' or null, got {self.rollout_is!r}")
        object.__setattr__(self, "_is_bounds", _parse_is_threshold(self.rollout_is_threshold))
        rs = () if self.rollout_rs is None else _parse_rs(self.rollout_rs, self.rollout_rs_threshold)
        object.__setattr__(self, "_rs_bounds", rs)

    @property
    def enabled(self) -> bool:
        """Whether any weight or mask is applied."""
        return self.rollout_is is not None or self.rollout_rs is not None


@dataclass(frozen=True)
class CorrectionResult:
    """What :func:`rollout_correction` returns, one list per row."""

    weights: list[list[float]]
    """IS weight of each token (0 on masked-out and padding tokens; 1.0 on trained tokens when
    ``rollout_is`` is off)."""
    masks: list[list[int]]
    """The response masks after rejection (``rollout_rs``); the input masks when it is off."""
    stats: dict[str, float]
    """``is_weight_mean``/``max`` (applied weights over the trained tokens), ``is_clipped_frac``
    (tokens whose raw weight was capped, or zeroed by IcePop), ``rs_masked_frac`` (tokens masked by
    rejection), ``rs_masked_rows`` (rows with at least one masked token), ``tokens``."""


def _check(
    behaviour: Sequence[Sequence[float]], proximal: Sequence[Sequence[float]], masks: Sequence[Sequence[int]]
) -> None:
    if not len(behaviour) == len(proximal) == len(masks):
        raise UserError(f"{len(behaviour)} behaviour rows, {len(proximal)} proximal rows, {len(masks)} masks")
    for i, (b, p, m) in enumerate(zip(behaviour, proximal, masks, strict=True)):
        if not len(b) == len(p) == len(m):
            raise UserError(f"row {i}: {len(b)} behaviour logprobs, {len(p)} proximal logprobs, {len(m)} mask entries")


def _clamp(x: float) -> float:
    return min(max(x, -SAFETY_BOUND), SAFETY_BOUND)


def rollout_correction(
    behaviour: Sequence[Sequence[float]],
    proximal: Sequence[Sequence[float]],
    masks: Sequence[Sequence[int]],
    correction: RolloutCorrection,
) -> CorrectionResult:
    """Per-token IS weights and rejection masks (see the module docstring).

    Args:
        behaviour: the sampling logprobs of each row's response tokens.
        proximal: the backend's recomputed logprobs of the same tokens (before the update).
        masks: each row's response mask (1: a trained token).
        correction: the settings.
    """
    _check(behaviour, proximal, masks)
    log_ratio = [
        [p - b for p, b in zip(prow, brow, strict=True)] for prow, brow in zip(proximal, behaviour, strict=True)
    ]
    mask = [[1 if m else 0 for m in row] for row in masks]
    tokens = sum(sum(row) for row in mask)
    stats: dict[str, float] = {"tokens": float(tokens)}
    weights = [[float(m) for m in row] for row in mask]
    if correction.rollout_is is not None:
        weights, clipped = _is_weights(log_ratio, mask, correction)
        applied = [w for wrow, mrow in zip(weights, mask, strict=True) for w, m in zip(wrow, mrow, strict=True) if m]
        stats["is_weight_mean"] = math.fsum(applied) / len(applied) if applied else 0.0
        stats["is_weight_max"] = max(applied, default=0.0)
        stats["is_clipped_frac"] = clipped / tokens if tokens else 0.0
    new_mask = mask
    if correction.rollout_rs is not None:
        new_mask = _rejection_mask(log_ratio, mask, correction._rs_bounds)
        masked = tokens - sum(sum(row) for row in new_mask)
        stats["rs_masked_frac"] = masked / tokens if tokens else 0.0
        stats["rs_masked_rows"] = float(sum(1 for old, new in zip(mask, new_mask, strict=True) if old != new))
    weights = [[w * m for w, m in zip(wrow, mrow, strict=True)] for wrow, mrow in zip(weights, new_mask, strict=True)]
    return CorrectionResult(weights=weights, masks=new_mask, stats=stats)


def _is_weights(
    log_ratio: list[list[float]], mask: list[list[int]], correction: RolloutCorrection
) -> tuple[list[list[float]], int]:
    """(weights, tokens capped or zeroed): verl's ``compute_rollout_correction_weights``."""
    upper, lower = correction._is_bounds
    raw: list[list[float]] = []
    for lr, m in zip(log_ratio, mask, strict=True):
        if correction.rollout_is == "token":
            raw.append([math.exp(_clamp(x)) * k for x, k in zip(lr, m, strict=True)])
        else:
            total = math.exp(_clamp(math.fsum(x * k for x, k in zip(lr, m, strict=True))))
            raw.append([total * k for k in m])
    out: list[list[float]] = []
    clipped = 0
    for rrow, m in zip(raw, mask, strict=True):
        row = []
        for w, k in zip(rrow, m, strict=True):
            if lower is None:
                capped = min(w, upper)
                clipped += 1 if k and w > upper else 0
            else:
                inside = lower <= w <= upper
                capped = w if inside else 0.0
                clipped += 1 if k and not inside else 0
            row.append(capped)
        out.append(row)
    if correction.rollout_is_batch_normalize:
        out = _batch_normalize(out, mask, correction.rollout_is == "token")
    return out, clipped


def _batch_normalize(weights: list[list[float]], mask: list[list[int]], token_level: bool) -> list[list[float]]:
    """Divide by the batch mean (over tokens, or over rows' mean weights), as verl does."""
    if token_level:
        total = math.fsum(w * k for wrow, m in zip(weights, mask, strict=True) for w, k in zip(wrow, m, strict=True))
        mean = total / _count(sum(sum(m) for m in mask))
    else:
        seq = [
            math.fsum(w * k for w, k in zip(wrow, m, strict=True)) / _count(sum(m))
            for wrow, m in zip(weights, mask, strict=True)
        ]
        valid = [1.0 if sum(m) > 0 else 0.0 for m in mask]
        mean = math.fsum(s * v for s, v in zip(seq, valid, strict=True)) / max(math.fsum(valid), _EPS)
    if mean <= _EPS:
        return weights
    return [[w / mean for w in row] for row in weights]


def _divergences(x: float) -> tuple[float, float, float]:
    """(k1, k2, k3) of one log ratio (clamped to ±20)."""
    x = _clamp(x)
    return -x, 0.5 * x * x, math.exp(x) - 1.0 - x


def _rejection_mask(log_ratio: list[list[float]], mask: list[list[int]], bounds: tuple[_Bound, ...]) -> list[list[int]]:
    """verl's ``compute_rollout_rejection_mask``: a token survives when every option passes."""
    out: list[list[int]] = []
    for lr, m in zip(log_ratio, mask, strict=True):
        ks = [_divergences(x) for x in lr]
        keep = [1] * len(lr)
        for b in bounds:
            which = int(b.option[-1]) - 1
            values = [k[which] for k in ks]
            if b.option.startswith("token"):
                passed = [_within(v, b) for v in values]
            else:
                n = sum(m)
                masked = [v for v, k in zip(values, m, strict=True) if k]
                if b.option.startswith("seq_sum"):
                    stat = math.fsum(masked)
                elif b.option.startswith("seq_mean"):
                    stat = math.fsum(masked) / _count(n)
                else:  # seq_max
                    stat = max(masked, default=0.0)
                passed = [_within(stat, b)] * len(lr)
            keep = [1 if k and p else 0 for k, p in zip(keep, passed, strict=True)]
        out.append([1 if k and mm else 0 for k, mm in zip(keep, m, strict=True)])
    return out


def _within(value: float, bound: _Bound) -> bool:
    if bound.lower is not None:
        return bound.lower <= value <= bound.upper
    return value <= bound.upper
