"""Which final reward of an episode counts: precedence by source, never by arrival order.

A final reward span (``agentbolt.reward.final = true``) says who gave it in
``agentbolt.feedback.source``:

=========  =====  ==========================================================
source     rank   given by
=========  =====  ==========================================================
``client``   3    a live client's feedback (``POST /v1/feedback``)
``judge``    2    an LLM judge scoring a session nobody rated
``agent``    1    the agent itself (``emit_reward(..., final=True)``, its
                  return value); also any span without a source
=========  =====  ==========================================================

The rule is the store's (every backend applies it when spans are written, in the same
transaction): a final reward is **refused** when the same attempt already holds a final reward
of a higher rank, so a judge that scores a session after its client rated it writes nothing.
Among the final rewards an attempt holds, the one that counts is the highest rank, the latest of
that rank (a client that rates twice changes its mind). LightningRL reads rewards by the same
rule (:func:`winning_final`), so the order in which a judge and a client arrive never matters.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final, TypeVar

from . import semconv

__all__ = ["RANKS", "final_rank", "is_final_reward", "reward_source", "winning_final"]

RANKS: Final[Mapping[str, int]] = {"client": 3, "judge": 2, "agent": 1}
"""Source -> rank (higher wins)."""

T = TypeVar("T")


def is_final_reward(attributes: Mapping[str, Any]) -> bool:
    """True for a reward span's attributes marked final."""
    if attributes.get(semconv.SPAN_KIND_ATTR) != semconv.KIND_REWARD and semconv.REWARD_VALUE not in attributes:
        return False
    flag = attributes.get(semconv.REWARD_IS_FINAL)
    return flag is True or (isinstance(flag, str) and flag.lower() == "true")


def reward_source(attributes: Mapping[str, Any]) -> str:
    """``client``, ``judge`` or ``agent`` (any other or no ``agentbolt.feedback.source``)."""
    source = attributes.get(semconv.FEEDBACK_SOURCE)
    return source if isinstance(source, str) and source in RANKS else "agent"


def final_rank(attributes: Mapping[str, Any]) -> int:
    """The precedence rank of a final reward span's attributes; 0 when it is not a final reward."""
    return RANKS[reward_source(attributes)] if is_final_reward(attributes) else 0


def winning_final(items: Iterable[tuple[T, Mapping[str, Any]]]) -> T | None:
    """The item whose final reward counts among ``(item, attributes)`` pairs in write order:
    the highest rank, the latest of that rank; ``None`` when none is a final reward."""
    best: T | None = None
    best_rank = 0
    for item, attributes in items:
        rank = final_rank(attributes)
        if rank and rank >= best_rank:
            best, best_rank = item, rank
    return best
