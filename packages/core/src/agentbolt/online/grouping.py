"""How sessions are grouped for advantages (GRPO needs several samples of the same task).

Live traffic has no "group of 4 rollouts per task" by construction, so an update regroups the
rewarded sessions it trains on (the rollout's stored ``group_id`` is left alone; LightningRL is
given copies with the group chosen here):

- ``task_key``: sessions with the same client-supplied task key
  (``X-Agentbolt-Task-Key`` / ``metadata.task_key``) form a group; sessions without one are
  groups of their own (advantage 0 under GRPO: nothing to compare with);
- ``prompt``: sessions that asked the same question (the last user message of their first
  call, :func:`.keys.prompt_text`; case and whitespace ignored) form a group: repeated questions compare with each other;
- ``batch``: every session of the update in one group, so each is compared with the batch's
  mean: the per-session baseline of REINFORCE++ (use ``advantage="reinforce_pp"`` or
  ``"grpo"``);
- ``auto`` (default): the task key when the session has one; else its prompt group when that
  group has at least ``min_group`` sessions in the update; else the batch group.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # annotations only: sessions reads its options, which name a Grouping
    from .sessions import Session

__all__ = ["Grouping", "group_ids"]

Grouping = Literal["auto", "task_key", "prompt", "batch"]


def group_ids(sessions: Sequence[Session], mode: Grouping, *, prefix: str, min_group: int = 2) -> list[str]:
    """The group id of each session in ``sessions`` (same order) under ``mode``."""
    batch = f"{prefix}:batch"
    if mode == "batch":
        return [batch] * len(sessions)
    if mode == "task_key":
        return [f"{prefix}:task:{s.task_key}" if s.task_key else f"{prefix}:one:{s.rollout_id}" for s in sessions]
    if mode == "prompt":
        return [f"{prefix}:prompt:{s.prompt_key}" if s.prompt_key else f"{prefix}:one:{s.rollout_id}" for s in sessions]
    if mode != "auto":
        raise ValueError(f"unknown grouping {mode!r}; use auto, task_key, prompt or batch")
    sizes = Counter(s.prompt_key for s in sessions if not s.task_key and s.prompt_key)
    out = []
    for s in sessions:
        if s.task_key:
            out.append(f"{prefix}:task:{s.task_key}")
        elif s.prompt_key and sizes[s.prompt_key] >= min_group:
            out.append(f"{prefix}:prompt:{s.prompt_key}")
        else:
            out.append(batch)
    return out
