"""Layer 1, verl-free: LightningRL's transitions packed into the padded tensors of a verl batch.

Only numpy and torch are imported here, and nothing is decided here: which calls are trained,
their credit, advantages and loss weights are LightningRL's
(:mod:`agentbolt.lightningrl`, configured by the ``agentbolt.lightningrl`` section). One
transition (one LLM call, or several merged into one masked sequence) becomes one row; keys,
shapes and padding follow verl 0.9.1's batch contract (``AgentLoopOutput.as_dict`` in
``verl/experimental/agent_loop/agent_loop.py``, ``verl/workers/utils/padding.py``):

======================  ===========  =======  ==================================================
key                     shape        dtype    content
======================  ===========  =======  ==================================================
``prompts``             (B, P)       int64    prompt ids, **left**-padded with ``pad_token_id``
``responses``           (B, R)       int64    response ids, **right**-padded
``input_ids``           (B, P+R)     int64    ``prompts ‖ responses``
``attention_mask``      (B, P+R)     int64    1 on real tokens, 0 on padding
``position_ids``        (B, P+R)     int64    ``clamp(cumsum(attention_mask) - 1, 0)``
``response_mask``       (B, R)       int64    ``Transition.response_mask`` (1: trained token)
``rollout_log_probs``   (B, R)       float32  sampling log-probs, 0 on padding (present only
                                              when every row has them)
``rm_scores``           (B, R)       float32  the row's reward on its last response token
                                              (verl's reward column; 0 without a reward)
======================  ===========  =======  ==================================================

Non-tensor columns (numpy object arrays): ``uid`` (the group: ``Transition.group_id``, else the
rollout id), ``rollout_id``, ``transition_index`` and ``is_pad``. ``multiple_of`` appends rows with
``response_mask`` 0 (never copies of samples) to reach a multiple of the data-parallel size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from agentbolt.errors import SchemaError, UserError
from agentbolt.types import Transition

__all__ = ["NON_TENSOR_KEYS", "PAD_PREFIX", "TENSOR_KEYS", "TransitionBatch", "pack_transitions"]

TENSOR_KEYS = (
    "prompts",
    "responses",
    "input_ids",
    "attention_mask",
    "position_ids",
    "response_mask",
    "rollout_log_probs",
    "rm_scores",
)
"""Tensor keys of a batch (``rollout_log_probs`` may be absent)."""

NON_TENSOR_KEYS = ("uid", "rollout_id", "transition_index", "is_pad")
"""Non-tensor keys of a batch."""

PAD_PREFIX = "__agentbolt_pad__"
"""Prefix of the ``uid``/``rollout_id`` of padding rows."""


@dataclass
class TransitionBatch:
    """Padded tensors and non-tensor columns in verl's layout, with the transitions they came from."""

    tensors: dict[str, torch.Tensor]
    """Tensor columns (see the module docstring)."""
    non_tensors: dict[str, np.ndarray]
    """Non-tensor columns as numpy object arrays."""
    transitions: list[Transition | None] = field(default_factory=list, repr=False)
    """The transition of each row (``None`` for padding rows); empty for a batch rebuilt from a
    ``DataProto``."""

    def __len__(self) -> int:
        return int(self.tensors["responses"].shape[0])

    @property
    def padding_rows(self) -> int:
        """Zero-mask rows added to reach a multiple."""
        return int(sum(bool(x) for x in self.non_tensors["is_pad"]))

    @property
    def prompt_width(self) -> int:
        """P: the padded prompt width."""
        return int(self.tensors["prompts"].shape[1])

    @property
    def response_width(self) -> int:
        """R: the padded response width."""
        return int(self.tensors["responses"].shape[1])


def pack_transitions(
    transitions: Sequence[Transition], *, pad_token_id: int = 0, multiple_of: int = 1
) -> TransitionBatch:
    """Transitions → a padded batch (see the module docstring).

    Raises:
        SchemaError: a transition has no prompt or response token, or a mask / logprobs of the
            wrong length (LightningRL never produces such a transition).
        UserError: ``multiple_of`` is not a positive integer.
    """
    if not isinstance(multiple_of, int) or isinstance(multiple_of, bool) or multiple_of < 1:
        raise UserError(f"multiple_of must be a positive integer, got {multiple_of!r}")
    rows: list[Transition | None] = list(transitions)
    for tr in transitions:
        n = len(tr.response_ids)
        if not tr.prompt_ids or not n:
            raise SchemaError(f"call {tr.index} of rollout {tr.rollout_id!r} has no prompt or no response token")
        if (tr.response_mask is not None and len(tr.response_mask) != n) or (
            tr.response_logprobs is not None and len(tr.response_logprobs) != n
        ):
            raise SchemaError(f"call {tr.index} of rollout {tr.rollout_id!r}: mask or logprobs length differs from {n}")
    excess = len(rows) % multiple_of
    if excess:
        rows += [None] * (multiple_of - excess)
    p_width = max((len(t.prompt_ids) for t in transitions), default=1)
    r_width = max((len(t.response_ids) for t in transitions), default=1)
    b = len(rows)
    prompts = torch.full((b, p_width), pad_token_id, dtype=torch.int64)
    responses = torch.full((b, r_width), pad_token_id, dtype=torch.int64)
    prompt_attn = torch.zeros((b, p_width), dtype=torch.int64)
    response_attn = torch.zeros((b, r_width), dtype=torch.int64)
    response_mask = torch.zeros((b, r_width), dtype=torch.int64)
    logprobs = torch.zeros((b, r_width), dtype=torch.float32)
    scores = torch.zeros((b, r_width), dtype=torch.float32)
    for i, t in enumerate(rows):
        if t is None:  # one prompt and one response token, masked out of everything
            prompt_attn[i, -1] = response_attn[i, 0] = 1
            continue
        p, r = len(t.prompt_ids), len(t.response_ids)
        prompts[i, p_width - p :] = torch.tensor(t.prompt_ids, dtype=torch.int64)
        prompt_attn[i, p_width - p :] = 1
        responses[i, :r] = torch.tensor(t.response_ids, dtype=torch.int64)
        response_attn[i, :r] = 1
        mask = t.response_mask if t.response_mask is not None else [1] * r
        response_mask[i, :r] = torch.tensor([1 if m else 0 for m in mask], dtype=torch.int64)
        if t.response_logprobs is not None:
            logprobs[i, :r] = torch.tensor(t.response_logprobs, dtype=torch.float32)
        scores[i, r - 1] = 0.0 if t.reward is None else float(t.reward)
    attention_mask = torch.cat([prompt_attn, response_attn], dim=1)
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": torch.clamp(torch.cumsum(attention_mask, dim=-1) - 1, min=0),
        "response_mask": response_mask,
        "rm_scores": scores,
    }
    if transitions and all(t.response_logprobs is not None for t in transitions):
        tensors["rollout_log_probs"] = logprobs
    pad_names = [f"{PAD_PREFIX}{i}" for i in range(b)]
    non_tensors = {
        "uid": _objects([pad_names[i] if t is None else (t.group_id or t.rollout_id) for i, t in enumerate(rows)]),
        "rollout_id": _objects([pad_names[i] if t is None else t.rollout_id for i, t in enumerate(rows)]),
        "transition_index": _objects([0 if t is None else t.index for t in rows]),
        "is_pad": _objects([t is None for t in rows]),
    }
    return TransitionBatch(tensors=tensors, non_tensors=non_tensors, transitions=rows)


def _objects(values: list) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out
