"""Core's off-policy correction equals verl 0.9.1's own rollout-correction functions.

Same inputs (behaviour = verl's ``rollout_log_prob``, proximal = verl's ``old_log_prob``, the
response masks) through :func:`agentbolt.lightningrl.rollout_correction` and through verl's
``compute_rollout_correction_and_rejection_mask`` (``verl/trainer/ppo/rollout_corr_helper.py``):
the same per-token weights and the same rejection masks, for every IS level and threshold form,
every rejection option, and their combinations (verl's presets: token TIS, sequence TIS,
sequence MIS, Geo-RS, K3-RS, IcePop).
"""

from __future__ import annotations

import random

import pytest
import torch

from agentbolt.lightningrl import RS_OPTIONS, LightningRLConfig, RolloutCorrection, rollout_correction
from agentbolt_verl._verl import import_verl

helper = import_verl("verl.trainer.ppo.rollout_corr_helper")
algorithm = import_verl("verl.trainer.config.algorithm")

_RS_THRESHOLD = {"k1": "0.6_1.8", "k2": 0.4, "k3": 0.3}
_SEQ_THRESHOLD = {"seq_sum_k1": "0.2_5.0", "seq_sum_k2": 1.5, "seq_sum_k3": 1.2}

CASES: list[tuple[str | None, float | str, bool, str | None, float | str | None]] = [
    ("token", 2.0, False, None, None),  # token TIS
    ("sequence", 2.0, False, None, None),  # sequence TIS
    ("token", 1.3, False, None, None),
    ("sequence", 5.0, True, None, None),  # batch-normalized
    ("token", 2.0, True, None, None),
    ("token", "0.5_2.0", False, None, None),  # IcePop
    ("sequence", "0.3_3.0", False, None, None),
    ("sequence", 2.0, False, "seq_sum_k1", "0.5_2.0"),  # sequence MIS (verl's decoupled_seq_is_rs)
    (None, 2.0, False, "seq_mean_k1", "0.9_1.1"),  # Geo-RS
    ("token", 2.0, False, "seq_mean_k3", 0.05),  # K3-RS + token TIS
    ("token", 2.0, False, "token_k1,seq_max_k2", "0.5_2.0,0.5"),
    (None, 2.0, False, "seq_sum_k1", 1.5),  # one ratio T: bounds 1/T..T
    *[(None, 2.0, False, option, _SEQ_THRESHOLD.get(option, _RS_THRESHOLD[option[-2:]])) for option in RS_OPTIONS],
]


def _inputs(seed: int) -> tuple[list[list[float]], list[list[float]], list[list[int]]]:
    """Ragged rows, padded by the caller; off-policy gaps from tiny to large; some masked tokens."""
    rng = random.Random(seed)
    behaviour, proximal, masks = [], [], []
    for _ in range(9):
        n = rng.randint(1, 7)
        spread = rng.choice([0.01, 0.2, 1.0, 3.0])
        b = [rng.uniform(-6.0, -0.01) for _ in range(n)]
        behaviour.append(b)
        proximal.append([x + rng.gauss(0.0, spread) for x in b])
        masks.append([1 if rng.random() > 0.15 else 0 for _ in range(n)])
    masks[0] = [1] * len(masks[0])  # verl requires at least one trained token
    return behaviour, proximal, masks


def _padded(rows: list[list[float]] | list[list[int]], width: int, dtype: torch.dtype) -> torch.Tensor:
    out = torch.zeros((len(rows), width), dtype=dtype)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=dtype)
    return out


@pytest.mark.parametrize(("rollout_is", "threshold", "normalize", "rollout_rs", "rs_threshold"), CASES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_weights_and_masks_equal_verls(rollout_is, threshold, normalize, rollout_rs, rs_threshold, seed) -> None:
    behaviour, proximal, masks = _inputs(seed)
    correction = RolloutCorrection(rollout_is, threshold, normalize, rollout_rs, rs_threshold)
    ours = rollout_correction(behaviour, proximal, masks, correction)

    width = max(len(r) for r in masks)
    mask = _padded(masks, width, torch.int64)
    weights_proto, verl_mask, metrics = helper.compute_rollout_correction_and_rejection_mask(
        old_log_prob=_padded(proximal, width, torch.float64),
        rollout_log_prob=_padded(behaviour, width, torch.float64),
        response_mask=mask,
        rollout_is=rollout_is,
        rollout_is_threshold=threshold,
        rollout_is_batch_normalize=normalize,
        rollout_rs=rollout_rs,
        rollout_rs_threshold=rs_threshold,
    )
    assert _padded(ours.masks, width, torch.int64).tolist() == verl_mask.tolist()
    # verl's loss applies its IS weights on its rejection-masked response_mask: compare what is applied
    verl_weights = weights_proto.batch["rollout_is_weights"] if weights_proto is not None else mask.double()
    applied = verl_weights * verl_mask
    assert torch.allclose(_padded(ours.weights, width, torch.float64), applied, rtol=1e-12, atol=1e-15)
    if rollout_rs is not None:
        assert ours.stats["rs_masked_frac"] == pytest.approx(
            metrics["rollout_corr/rollout_rs_masked_fraction"], abs=1e-7
        )


def test_the_config_fields_are_verls_rollout_correction_fields() -> None:
    """LightningRLConfig spells each correction field as verl's RolloutCorrectionConfig does."""
    verl_fields = set(algorithm.RolloutCorrectionConfig.__dataclass_fields__)
    ours = {name for name in LightningRLConfig.model_fields if name.startswith("rollout_")}
    assert ours == {
        "rollout_is",
        "rollout_is_threshold",
        "rollout_is_batch_normalize",
        "rollout_rs",
        "rollout_rs_threshold",
    }
    assert ours <= verl_fields
    preset = algorithm.RolloutCorrectionConfig.decoupled_seq_is_rs()  # verl's "Seq-MIS"
    cfg = LightningRLConfig(**{name: getattr(preset, name) for name in ours})
    assert cfg.correction == RolloutCorrection("sequence", 2.0, False, "seq_sum_k1", "0.5_2.0")
