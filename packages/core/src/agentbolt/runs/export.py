"""Transitions as supervised fine-tuning records (``agentbolt export --format sft-jsonl``).

One JSON object per transition, in TRL's conversational format plus the exact tokens:

- ``messages``: the chat the policy saw (``gen_ai.input.messages`` of the transition's LLM-call
  span) followed by the assistant reply it produced (``gen_ai.output.messages``), for trainers
  that apply a chat template themselves (TRL ``SFTTrainer`` with a ``messages`` column);
- ``input_ids``, ``attention_mask``, ``labels`` (``-100`` on prompt tokens and on response tokens
  the policy did not generate) and ``assistant_masks``: the token ids the gateway recorded, for
  trainers that take tokenized data as is (no re-tokenization drift);
- ``prompt_ids``, ``response_ids``, ``reward``, ``advantage``, ``rollout_id``, ``task_id``,
  ``index``, ``policy_version``: where it came from.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from .. import semconv
from .. import types as t

__all__ = ["IGNORE_INDEX", "sft_record", "sft_records"]

IGNORE_INDEX = -100
"""Label of tokens that carry no loss (PyTorch's ``CrossEntropyLoss`` default)."""


def _messages(span: t.Span | None, attribute: str) -> list[dict[str, Any]]:
    if span is None:
        return []
    raw = span.attributes.get(attribute)
    if not isinstance(raw, str):
        return []
    try:
        value = json.loads(raw)
    except ValueError:
        return []
    return [m for m in value if isinstance(m, dict)] if isinstance(value, list) else []


def sft_record(transition: t.Transition, span: t.Span | None) -> dict[str, Any]:
    """The SFT record of one transition (``span``: its LLM-call span, for the chat messages)."""
    prompt, response = list(transition.prompt_ids), list(transition.response_ids)
    mask = list(transition.response_mask) if transition.response_mask is not None else [1] * len(response)
    replies = _messages(span, semconv.GEN_AI_OUTPUT_MESSAGES)[:1]
    assistant = [{k: v for k, v in m.items() if k != "finish_reason"} for m in replies]
    return {
        "messages": _messages(span, semconv.GEN_AI_INPUT_MESSAGES) + assistant,
        "input_ids": prompt + response,
        "attention_mask": [1] * (len(prompt) + len(response)),
        "labels": [IGNORE_INDEX] * len(prompt)
        + [tok if m else IGNORE_INDEX for tok, m in zip(response, mask, strict=True)],
        "assistant_masks": [0] * len(prompt) + mask,
        "prompt_ids": prompt,
        "response_ids": response,
        "reward": transition.reward,
        "advantage": transition.advantage,
        "rollout_id": transition.rollout_id,
        "task_id": transition.task_id,
        "index": transition.index,
        "policy_version": transition.policy_version,
    }


def sft_records(
    transitions: Sequence[t.Transition], spans: Mapping[str, Sequence[t.Span]], *, min_reward: float | None = None
) -> list[dict[str, Any]]:
    """SFT records of ``transitions`` whose reward is at least ``min_reward`` (all if ``None``)."""
    by_id = {s.span_id: s for group in spans.values() for s in group}
    return [
        sft_record(tr, by_id.get(tr.span_id) if tr.span_id else None)
        for tr in transitions
        if min_reward is None or (tr.reward is not None and tr.reward >= min_reward)
    ]
