"""Layer 1, verl-free: LightningRL transitions → the padded tensors verl's PPO/GRPO update reads.

Only numpy and torch are imported here. One :class:`~agentbolt.types.Transition` (one LLM
call, or several merged into one masked sequence) becomes one row. The keys, shapes and
padding follow verl 0.9.1's batch contract (``verl/experimental/agent_loop/agent_loop.py``
``_agent_loop_postprocess`` and ``verl/workers/utils/padding.py``):

======================  ===========  =======  ==================================================
key                     shape        dtype    content
======================  ===========  =======  ==================================================
``prompts``             (B, P)       int64    prompt ids, **left**-padded with ``pad_token_id``
``responses``           (B, R)       int64    response ids, **right**-padded
``input_ids``           (B, P+R)     int64    ``prompts ‖ responses``
``attention_mask``      (B, P+R)     int64    1 on real tokens, 0 on padding
``position_ids``        (B, P+R)     int64    ``clamp(cumsum(attention_mask) - 1, 0)``
``response_mask``       (B, R)       int64    1 where a policy-sampled token is trained
                                              (``Transition.response_mask`` for merged
                                              trajectories), 0 on observations and padding
``rollout_log_probs``   (B, R)       float32  sampling log-probs, 0 on padding (present only
                                              when every row has them)
``token_level_scores``  (B, R)       float32  the row's reward on its last real response token
``advantages``          (B, R)       float32  only with ``advantages="transition"``:
                                              ``Transition.advantage`` on trained tokens
======================  ===========  =======  ==================================================

Non-tensor columns (numpy object arrays): ``uid`` (the GRPO group: ``Transition.group_id``),
``rollout_id``, ``transition_index`` and ``is_pad``.

Every rule that removes or changes data is counted in :class:`BatchStats`, never silent:
empty prompts or responses, calls without exact token ids, rows with nothing to train on, no
reward, no advantage, no log-probs when they are required, overlong prompts and responses
(``drop`` or ``truncate``), and the rows dropped or added to reach a multiple of the
data-parallel size. Padding rows added for divisibility have ``response_mask`` 0 everywhere,
so they never enter the loss (unlike verl's ``pad_dataproto_to_divisor``, which repeats rows).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import Literal

import numpy as np
import torch

from agentbolt.errors import UserError
from agentbolt.types import TokenSource, Transition

__all__ = [
    "NON_TENSOR_KEYS",
    "TENSOR_KEYS",
    "BatchOptions",
    "BatchStats",
    "PreparedRow",
    "TransitionBatch",
    "build_batch",
    "fit_to_multiple",
    "pad_rows",
    "prepare_rows",
]

logger = logging.getLogger(__name__)

TENSOR_KEYS = (
    "prompts",
    "responses",
    "input_ids",
    "attention_mask",
    "position_ids",
    "response_mask",
    "rollout_log_probs",
    "token_level_scores",
)
"""Tensor keys of a batch (``rollout_log_probs`` may be absent; ``advantages`` may be added)."""

NON_TENSOR_KEYS = ("uid", "rollout_id", "transition_index", "is_pad")
"""Non-tensor keys of a batch."""

PAD_PREFIX = "__agentbolt_pad__"
"""Prefix of the ``uid``/``rollout_id`` of padding rows (one singleton group each)."""

Overlong = Literal["drop", "truncate"]


@dataclass(frozen=True)
class BatchOptions:
    """How transitions become rows. Lengths are in tokens."""

    max_prompt_length: int
    """Longest prompt kept (verl: ``actor_rollout_ref.rollout.prompt_length``)."""
    max_response_length: int
    """Longest response kept (verl: ``actor_rollout_ref.rollout.response_length``)."""
    overlong_prompt: Overlong = "drop"
    """``drop`` the row, or ``truncate`` to the last ``max_prompt_length`` tokens (the policy
    then trains on a context it did not see: off-policy)."""
    overlong_response: Overlong = "truncate"
    """``drop`` the row, or ``truncate`` to the first ``max_response_length`` tokens."""
    pad_token_id: int = 0
    """Id written into padding positions (masked out everywhere)."""
    missing_reward: Literal["drop", "zero"] = "drop"
    """Rows whose ``reward`` is ``None``: ``drop`` them or train them with reward 0."""
    retokenized: Literal["drop", "keep"] = "drop"
    """Calls whose ids were re-tokenized from text (``token_source=retokenized``)."""
    logprobs: Literal["require", "optional", "ignore"] = "optional"
    """``require``: drop rows without log-probs; ``optional``: emit ``rollout_log_probs`` only
    when every row has them; ``ignore``: never emit them."""
    advantages: Literal["verl", "transition"] = "verl"
    """``verl``: verl computes advantages from ``token_level_scores``; ``transition``: emit
    ``Transition.advantage`` as ``advantages`` and drop rows without one."""
    fixed_width: bool = False
    """Pad to the maximum lengths instead of the longest row of the batch."""
    multiple_of: int = 1
    """Make the row count a multiple of this (the data-parallel size, or the mini-batch)."""
    multiple_policy: Literal["pad", "floor"] = "pad"
    """``pad``: add zero-mask rows; ``floor``: drop rows, those of zero-variance groups first."""

    def __post_init__(self) -> None:
        for name in ("max_prompt_length", "max_response_length", "multiple_of"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise UserError(f"BatchOptions.{name} must be a positive integer, got {value!r}")
        choices = {
            "overlong_prompt": ("drop", "truncate"),
            "overlong_response": ("drop", "truncate"),
            "missing_reward": ("drop", "zero"),
            "retokenized": ("drop", "keep"),
            "logprobs": ("require", "optional", "ignore"),
            "advantages": ("verl", "transition"),
            "multiple_policy": ("pad", "floor"),
        }
        for name, valid in choices.items():
            if getattr(self, name) not in valid:
                raise UserError(f"BatchOptions.{name} must be one of {', '.join(valid)}; got {getattr(self, name)!r}")


@dataclass
class BatchStats:
    """What happened to the transitions of a batch. Every field is a count."""

    transitions_in: int = 0
    """Transitions given."""
    rows: int = 0
    """Real rows in the batch (after every drop; padding rows not included)."""
    dropped_empty_response: int = 0
    """No response token (or ``token_source=missing``)."""
    dropped_empty_prompt: int = 0
    """No prompt token (verl's padding converters need at least one)."""
    dropped_malformed: int = 0
    """``response_mask`` or ``response_logprobs`` length differs from ``response_ids``."""
    dropped_retokenized: int = 0
    """Ids re-tokenized from text, with ``retokenized="drop"``."""
    dropped_no_trainable_tokens: int = 0
    """``response_mask`` has no 1 (after truncation)."""
    dropped_no_reward: int = 0
    """``reward`` is ``None``, with ``missing_reward="drop"``."""
    dropped_no_advantage: int = 0
    """``advantage`` is ``None``, with ``advantages="transition"``."""
    dropped_no_logprobs: int = 0
    """No ``response_logprobs``, with ``logprobs="require"``."""
    dropped_overlong_prompt: int = 0
    """Prompt longer than ``max_prompt_length``, with ``overlong_prompt="drop"``."""
    dropped_overlong_response: int = 0
    """Response longer than ``max_response_length``, with ``overlong_response="drop"``."""
    dropped_to_multiple: int = 0
    """Dropped to make the row count a multiple (``multiple_policy="floor"``)."""
    truncated_prompt: int = 0
    """Prompts cut to their last ``max_prompt_length`` tokens."""
    truncated_response: int = 0
    """Responses cut to their first ``max_response_length`` tokens."""
    zero_filled_reward: int = 0
    """Rewards set to 0 (``missing_reward="zero"``)."""
    missing_group_id: int = 0
    """Rows without ``group_id``: each becomes its own group (keyed by its rollout id)."""
    retokenized_kept: int = 0
    """Rows trained on re-tokenized ids (``retokenized="keep"``)."""
    logprobs_omitted: int = 0
    """Rows without log-probs that made ``rollout_log_probs`` absent (``logprobs="optional"``)."""
    padding_rows: int = 0
    """Zero-mask rows added to reach a multiple (``multiple_policy="pad"``)."""

    @property
    def dropped(self) -> int:
        """Rows dropped for any reason."""
        return sum(getattr(self, f.name) for f in fields(self) if f.name.startswith("dropped_"))

    def merge(self, other: BatchStats) -> BatchStats:
        """Add ``other``'s counts into this one (in place); returns ``self``."""
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        return self

    def as_metrics(self, prefix: str = "agentbolt/batch/") -> dict[str, float]:
        """The counts as a flat metrics dict (plus ``dropped``)."""
        out = {f"{prefix}{f.name}": float(getattr(self, f.name)) for f in fields(self)}
        out[f"{prefix}dropped"] = float(self.dropped)
        return out


@dataclass(frozen=True)
class PreparedRow:
    """One row after the drop and truncation rules, before padding."""

    uid: str
    """GRPO group."""
    rollout_id: str
    """Rollout the row belongs to."""
    index: int
    """``Transition.index`` (call order within the rollout)."""
    prompt_ids: list[int]
    """Prompt ids (possibly truncated)."""
    response_ids: list[int]
    """Response ids (possibly truncated)."""
    response_mask: list[int]
    """1 on trained tokens."""
    logprobs: list[float] | None
    """Sampling log-probs of the response tokens, if known."""
    reward: float
    """The row's reward."""
    advantage: float | None = None
    """``Transition.advantage``, when used."""
    transition: Transition | None = field(default=None, repr=False, compare=False)
    """The source transition (``None`` for padding rows)."""
    is_pad: bool = False
    """A zero-mask row added for divisibility."""


def prepare_rows(
    transitions: Iterable[Transition], options: BatchOptions, stats: BatchStats | None = None
) -> tuple[list[PreparedRow], BatchStats]:
    """Apply the drop and truncation rules; returns the kept rows (input order) and the counts."""
    stats = stats if stats is not None else BatchStats()
    rows: list[PreparedRow] = []
    for t in transitions:
        stats.transitions_in += 1
        row = _prepare_one(t, options, stats)
        if row is not None:
            rows.append(row)
    stats.rows = sum(1 for r in rows if not r.is_pad)
    return rows, stats


def _prepare_one(t: Transition, options: BatchOptions, stats: BatchStats) -> PreparedRow | None:
    response = list(t.response_ids)
    prompt = list(t.prompt_ids)
    if t.token_source == TokenSource.MISSING or not response:
        stats.dropped_empty_response += 1
        return None
    if not prompt:
        stats.dropped_empty_prompt += 1
        return None
    mask = list(t.response_mask) if t.response_mask is not None else [1] * len(response)
    logprobs = list(t.response_logprobs) if t.response_logprobs is not None else None
    if len(mask) != len(response) or (logprobs is not None and len(logprobs) != len(response)):
        stats.dropped_malformed += 1
        return None
    if t.token_source == TokenSource.RETOKENIZED:
        if options.retokenized == "drop":
            stats.dropped_retokenized += 1
            return None
        stats.retokenized_kept += 1
    if not any(mask):
        stats.dropped_no_trainable_tokens += 1
        return None
    reward = t.reward
    if reward is None and options.missing_reward == "drop":
        stats.dropped_no_reward += 1
        return None
    if options.advantages == "transition" and t.advantage is None:
        stats.dropped_no_advantage += 1
        return None
    if logprobs is None and options.logprobs == "require":
        stats.dropped_no_logprobs += 1
        return None
    if len(prompt) > options.max_prompt_length:
        if options.overlong_prompt == "drop":
            stats.dropped_overlong_prompt += 1
            return None
        prompt = prompt[-options.max_prompt_length :]
        stats.truncated_prompt += 1
    if len(response) > options.max_response_length:
        if options.overlong_response == "drop":
            stats.dropped_overlong_response += 1
            return None
        n = options.max_response_length
        response, mask = response[:n], mask[:n]
        logprobs = logprobs[:n] if logprobs is not None else None
        stats.truncated_response += 1
        if not any(mask):
            stats.dropped_no_trainable_tokens += 1
            return None
    if reward is None:
        reward = 0.0
        stats.zero_filled_reward += 1
    uid = t.group_id
    if uid is None:
        uid = t.rollout_id
        stats.missing_group_id += 1
    return PreparedRow(
        uid=uid,
        rollout_id=t.rollout_id,
        index=t.index,
        prompt_ids=prompt,
        response_ids=response,
        response_mask=[1 if m else 0 for m in mask],
        logprobs=None if options.logprobs == "ignore" else logprobs,
        reward=float(reward),
        advantage=None if options.advantages == "verl" else float(t.advantage),  # type: ignore[arg-type]
        transition=t,
    )


def fit_to_multiple(rows: list[PreparedRow], options: BatchOptions, stats: BatchStats) -> list[PreparedRow]:
    """Make ``len(rows)`` a multiple of ``options.multiple_of`` (``pad`` or ``floor``).

    ``pad`` appends rows with one prompt token, one response token and ``response_mask`` 0:
    they take part in no loss, no advantage group (each is its own singleton group) and no
    reward. ``floor`` drops rows, first those of groups whose rewards are all equal (their
    group-normalized advantage is 0, so they carry no learning signal), last rows first.
    """
    m = options.multiple_of
    excess = len(rows) % m
    if m == 1 or excess == 0:
        return rows
    if options.multiple_policy == "pad":
        pads = [_pad_row(i, options.pad_token_id) for i in range(m - excess)]
        stats.padding_rows += len(pads)
        return rows + pads
    rewards: dict[str, set[float]] = {}
    for r in rows:
        rewards.setdefault(r.uid, set()).add(r.reward)
    flat = {uid for uid, values in rewards.items() if len(values) == 1}
    order = sorted(range(len(rows)), key=lambda i: (rows[i].uid not in flat, -i))
    drop = set(order[:excess])
    stats.dropped_to_multiple += excess
    return [r for i, r in enumerate(rows) if i not in drop]


def _pad_row(i: int, pad_token_id: int) -> PreparedRow:
    name = f"{PAD_PREFIX}{i}"
    return PreparedRow(
        uid=name,
        rollout_id=name,
        index=0,
        prompt_ids=[pad_token_id],
        response_ids=[pad_token_id],
        response_mask=[0],
        logprobs=[0.0],
        reward=0.0,
        advantage=0.0,
        is_pad=True,
    )


@dataclass
class TransitionBatch:
    """Padded tensors and non-tensor columns in verl's layout, with the rows they came from."""

    tensors: dict[str, torch.Tensor]
    """Tensor columns (see the module docstring)."""
    non_tensors: dict[str, np.ndarray]
    """Non-tensor columns as numpy object arrays."""
    stats: BatchStats
    """What the drop, truncation and divisibility rules did."""
    rows: list[PreparedRow] = field(default_factory=list, repr=False)
    """The rows, in batch order (empty for a batch rebuilt from a ``DataProto``)."""

    def __len__(self) -> int:
        return int(self.tensors["responses"].shape[0])

    @property
    def prompt_width(self) -> int:
        """P: the padded prompt width."""
        return int(self.tensors["prompts"].shape[1])

    @property
    def response_width(self) -> int:
        """R: the padded response width."""
        return int(self.tensors["responses"].shape[1])

    def metrics(self, prefix: str = "agentbolt/batch/") -> dict[str, float]:
        """:meth:`BatchStats.as_metrics` of this batch."""
        return self.stats.as_metrics(prefix)

    def transitions_with_advantages(self, advantages: torch.Tensor) -> list[Transition]:
        """The batch's transitions with ``advantage`` set from a (B, R) advantages tensor.

        Each transition gets the value at its first trained token (outcome estimators put one
        value on every trained token). Padding rows are skipped.
        """
        if tuple(advantages.shape) != tuple(self.tensors["response_mask"].shape):
            raise UserError(
                f"advantages have shape {tuple(advantages.shape)}, the batch's response_mask "
                f"{tuple(self.tensors['response_mask'].shape)}"
            )
        if not self.rows:
            raise UserError("this batch has no source transitions (was it rebuilt from a DataProto?)")
        mask = self.tensors["response_mask"].bool()
        out = []
        for i, row in enumerate(self.rows):
            if row.is_pad or row.transition is None:
                continue
            first = int(mask[i].nonzero()[0, 0])
            out.append(row.transition.model_copy(update={"advantage": float(advantages[i, first])}))
        return out


def pad_rows(rows: Sequence[PreparedRow], options: BatchOptions, stats: BatchStats) -> TransitionBatch:
    """Pad prepared rows into verl's tensor layout."""
    if options.fixed_width:
        p_width, r_width = options.max_prompt_length, options.max_response_length
    else:
        p_width = max((len(r.prompt_ids) for r in rows), default=1)
        r_width = max((len(r.response_ids) for r in rows), default=1)
    b = len(rows)
    pad = options.pad_token_id
    prompts = torch.full((b, p_width), pad, dtype=torch.int64)
    responses = torch.full((b, r_width), pad, dtype=torch.int64)
    prompt_attn = torch.zeros((b, p_width), dtype=torch.int64)
    response_attn = torch.zeros((b, r_width), dtype=torch.int64)
    response_mask = torch.zeros((b, r_width), dtype=torch.int64)
    scores = torch.zeros((b, r_width), dtype=torch.float32)
    logprobs = torch.zeros((b, r_width), dtype=torch.float32)
    advantages = torch.zeros((b, r_width), dtype=torch.float32)
    real = [r for r in rows if not r.is_pad]
    missing = sum(1 for r in real if r.logprobs is None)
    have_logprobs = options.logprobs != "ignore" and missing == 0
    if options.logprobs == "optional" and missing:
        stats.logprobs_omitted += missing
        logger.warning(
            "%d of %d rows have no sampling log-probs: the batch carries no rollout_log_probs", missing, len(real)
        )
    for i, row in enumerate(rows):
        p, r = len(row.prompt_ids), len(row.response_ids)
        prompts[i, p_width - p :] = torch.tensor(row.prompt_ids, dtype=torch.int64)
        prompt_attn[i, p_width - p :] = 1
        responses[i, :r] = torch.tensor(row.response_ids, dtype=torch.int64)
        response_attn[i, :r] = 1
        response_mask[i, :r] = torch.tensor(row.response_mask, dtype=torch.int64)
        scores[i, r - 1] = row.reward
        if have_logprobs and row.logprobs is not None:
            logprobs[i, :r] = torch.tensor(row.logprobs, dtype=torch.float32)
        if row.advantage is not None:
            advantages[i, :r] = row.advantage * response_mask[i, :r].float()
    attention_mask = torch.cat([prompt_attn, response_attn], dim=1)
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": torch.clamp(torch.cumsum(attention_mask, dim=-1) - 1, min=0),
        "response_mask": response_mask,
        "token_level_scores": scores,
    }
    if have_logprobs:
        tensors["rollout_log_probs"] = logprobs
    if options.advantages == "transition":
        tensors["advantages"] = advantages
    non_tensors = {
        "uid": _objects([r.uid for r in rows]),
        "rollout_id": _objects([r.rollout_id for r in rows]),
        "transition_index": _objects([r.index for r in rows]),
        "is_pad": _objects([r.is_pad for r in rows]),
    }
    stats.rows = sum(1 for r in rows if not r.is_pad)
    return TransitionBatch(tensors=tensors, non_tensors=non_tensors, stats=stats, rows=list(rows))


def build_batch(transitions: Iterable[Transition], options: BatchOptions) -> TransitionBatch:
    """Transitions → a padded batch: :func:`prepare_rows`, :func:`fit_to_multiple`, :func:`pad_rows`.

    Logs one warning when rows were dropped (the counts are in ``batch.stats``).
    """
    rows, stats = prepare_rows(transitions, options)
    rows = fit_to_multiple(rows, options, stats)
    batch = pad_rows(rows, options, stats)
    if stats.dropped:
        reasons = {k: v for k, v in stats.as_metrics("").items() if k.startswith("dropped_") and v}
        logger.warning("dropped %d of %d transitions: %s", stats.dropped, stats.transitions_in, reasons)
    return batch


def _objects(values: list) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out
