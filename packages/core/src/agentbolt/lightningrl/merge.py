"""Trajectory merging: consecutive calls of one agent in one rollout → one masked sequence.

Calls ``a`` then ``b`` (consecutive among the transitions of the same rollout and agent, in
call order) merge only when ``b.prompt_ids`` is an exact token-prefix extension of
``a.prompt_ids + a.response_ids``. The merged transition keeps ``a``'s prompt; its response is
``a.response + observation + b.response`` where the observation (the tokens ``b``'s prompt adds:
tool outputs, user turns) gets ``response_mask`` 0 and logprob 0.0. So the merged prompt +
response is exactly ``b``'s prompt + response, and the mask-1 tokens are exactly the calls'
own responses, in order.

They stay separate transitions (counted by reason) when the prefix does not match
(``not_prefix``: chat-template re-rendering, truncated history, retokenization), when their
credit differs (``credit_differs``: a merged sequence has one reward and one advantage), when
policy version, token source or logprob availability differ (``incompatible``), or when the
merged sequence would exceed ``max_length`` (``over_length``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..types import Transition

__all__ = ["MergeResult", "merge_transitions"]


@dataclass(frozen=True)
class MergeResult:
    """Merged transitions and why calls were or were not merged."""

    transitions: list[Transition]
    """Output transitions (ordered by rollout, then first call index)."""
    stats: dict[str, int] = field(default_factory=dict)
    """``input``, ``output``, ``merged`` (calls folded into a previous one) and the split
    reasons ``not_prefix``, ``credit_differs``, ``incompatible``, ``over_length``."""


def _split_reason(acc: Transition, nxt: Transition, max_length: int | None) -> str | None:
    context_len = len(acc.prompt_ids) + len(acc.response_ids)
    if len(nxt.prompt_ids) < context_len or nxt.prompt_ids[: len(acc.prompt_ids)] != acc.prompt_ids:
        return "not_prefix"
    if nxt.prompt_ids[len(acc.prompt_ids) : context_len] != acc.response_ids:
        return "not_prefix"
    if acc.reward != nxt.reward or acc.advantage != nxt.advantage:
        return "credit_differs"
    if (
        acc.policy_version != nxt.policy_version
        or acc.token_source != nxt.token_source
        or (acc.response_logprobs is None) != (nxt.response_logprobs is None)
        or acc.attempt_id != nxt.attempt_id
    ):
        return "incompatible"
    if max_length is not None and len(nxt.prompt_ids) + len(nxt.response_ids) > max_length:
        return "over_length"
    return None


def _fold(acc: Transition, nxt: Transition) -> Transition:
    context_len = len(acc.prompt_ids) + len(acc.response_ids)
    observation = nxt.prompt_ids[context_len:]
    acc_mask = acc.response_mask if acc.response_mask is not None else [1] * len(acc.response_ids)
    nxt_mask = nxt.response_mask if nxt.response_mask is not None else [1] * len(nxt.response_ids)
    logprobs = None
    if acc.response_logprobs is not None and nxt.response_logprobs is not None:
        logprobs = [*acc.response_logprobs, *([0.0] * len(observation)), *nxt.response_logprobs]
    meta: dict[str, Any] = dict(acc.metadata)
    span_ids, indices = acc.metadata.get("merged_span_ids"), acc.metadata.get("merged_indices")
    meta["merged_span_ids"] = [*(span_ids if isinstance(span_ids, list) else [acc.span_id]), nxt.span_id]
    meta["merged_indices"] = [*(indices if isinstance(indices, list) else [acc.index]), nxt.index]
    return acc.model_copy(
        update={
            "response_ids": [*acc.response_ids, *observation, *nxt.response_ids],
            "response_mask": [*acc_mask, *([0] * len(observation)), *nxt_mask],
            "response_logprobs": logprobs,
            "finish_reason": nxt.finish_reason,
            "metadata": meta,
        }
    )


def merge_transitions(transitions: Sequence[Transition], *, max_length: int | None = None) -> MergeResult:
    """Merge consecutive calls of the same rollout and agent into masked sequences (rules in
    the module docstring). Transitions of one stream are taken in ``index`` order."""
    streams: dict[tuple[str, str | None], list[Transition]] = {}
    for t in transitions:
        streams.setdefault((t.rollout_id, t.agent_name), []).append(t)
    stats: Counter[str] = Counter(input=len(transitions))
    merged: list[Transition] = []
    for stream in streams.values():
        stream.sort(key=lambda t: t.index)
        acc = stream[0]
        for nxt in stream[1:]:
            reason = _split_reason(acc, nxt, max_length)
            if reason is None:
                acc = _fold(acc, nxt)
                stats["merged"] += 1
            else:
                stats[reason] += 1
                merged.append(acc)
                acc = nxt
        merged.append(acc)
    order = {rid: i for i, rid in enumerate(dict.fromkeys(t.rollout_id for t in transitions))}
    merged.sort(key=lambda t: (order[t.rollout_id], t.index))
    stats["output"] = len(merged)
    return MergeResult(transitions=merged, stats=dict(stats))
