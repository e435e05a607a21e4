"""Layer 2: a :class:`~agentbolt_verl.batch.TransitionBatch` as verl's ``DataProto``, and back.

Also exposes verl's own padding converters on such a batch, which is what verl's workers do
with every batch they receive (``verl/trainer/ppo/ray_trainer.py`` ``_compute_old_log_prob``:
``left_right_2_no_padding`` before the model, ``no_padding_2_padding`` after it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from ._verl import import_verl
from .batch import TransitionBatch

import_verl("verl")

from tensordict import TensorDict  # noqa: E402  (verl's dependency)
from verl import DataProto  # noqa: E402
from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding  # noqa: E402

__all__ = ["from_dataproto", "response_values", "to_dataproto", "to_no_padding"]

_NO_PADDING_INPUTS = ("prompts", "responses", "input_ids", "attention_mask", "position_ids", "response_mask")


def to_dataproto(
    batch: TransitionBatch,
    *,
    temperature: float | None = None,
    global_steps: int | None = None,
    meta_info: Mapping[str, Any] | None = None,
) -> DataProto:
    """The batch as a ``DataProto`` (tensors in ``.batch``, object arrays in ``.non_tensor_batch``).

    ``meta_info`` gets ``global_token_num`` (per-row real token counts, used by verl's
    throughput metrics and balancing), and ``temperature`` / ``global_steps`` when given:
    verl divides logits by ``meta_info["temperature"]``, so it must equal the sampling
    temperature.
    """
    meta: dict[str, Any] = {"global_token_num": batch.tensors["attention_mask"].sum(dim=-1).tolist()}
    if temperature is not None:
        meta["temperature"] = float(temperature)
    if global_steps is not None:
        meta["global_steps"] = int(global_steps)
    meta.update(meta_info or {})
    return DataProto.from_dict(
        tensors=dict(batch.tensors),
        non_tensors={k: np.asarray(v, dtype=object).copy() for k, v in batch.non_tensors.items()},
        meta_info=meta,
    )


def from_dataproto(data: DataProto) -> TransitionBatch:
    """A ``DataProto`` (with this package's keys) back as a :class:`TransitionBatch` (without
    the source transitions)."""
    missing = [k for k in ("prompts", "responses", "response_mask", "attention_mask") if k not in data.batch.keys()]  # noqa: SIM118 (TensorDict)
    if missing:
        raise KeyError(f"DataProto lacks {missing}; has {sorted(data.batch.keys())}")
    tensors = {k: data.batch[k] for k in data.batch.keys()}  # noqa: SIM118
    non_tensors = {k: np.asarray(v, dtype=object) for k, v in data.non_tensor_batch.items()}
    return TransitionBatch(tensors=tensors, non_tensors=non_tensors)


def to_no_padding(data: DataProto) -> TensorDict:
    """verl's ``left_right_2_no_padding`` on a copy of the batch: jagged ``input_ids``,
    ``position_ids`` and ``loss_mask``, as the actor and critic workers receive them."""
    td = data.batch.select(*[k for k in _NO_PADDING_INPUTS if k in data.batch.keys()]).clone()  # noqa: SIM118
    return left_right_2_no_padding(td)


def response_values(per_token: torch.Tensor, no_padding: TensorDict) -> torch.Tensor:
    """verl's ``no_padding_2_padding``: per-token model outputs (jagged, one value per input
    token, the value at position ``j`` being about token ``j + 1``) → a (B, R) tensor aligned
    with ``responses``."""
    return no_padding_2_padding(per_token, no_padding)
