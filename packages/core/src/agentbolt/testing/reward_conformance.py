"""Conformance tests of the final-reward precedence rule (:mod:`agentbolt.reward_precedence`):
a client's final reward beats a judge's, a judge's an agent's, whatever order they are written in.

Mixed into :class:`~agentbolt.testing.store_conformance.StoreConformance`, so every backend runs
them; they need its ``store`` fixture.
"""

from __future__ import annotations

import asyncio
import itertools

import pytest

from .. import semconv
from .. import types as t
from ..reward_precedence import winning_final
from ..store.base import Store

__all__ = ["RewardPrecedenceConformance", "final_reward_span"]


def final_reward_span(rollout_id: str, attempt_id: str | None, value: float, source: str | None) -> t.Span:
    """A final reward span as the feedback API, a judge (``source``) or an agent (``None``) writes it."""
    attributes: dict[str, t.AttributeValue] = {
        semconv.SPAN_KIND_ATTR: semconv.KIND_REWARD,
        semconv.REWARD_VALUE: value,
        semconv.REWARD_IS_FINAL: True,
    }
    if source is not None:
        attributes[semconv.FEEDBACK_SOURCE] = source
    return t.Span.create(semconv.SPAN_REWARD, rollout_id=rollout_id, attempt_id=attempt_id, attributes=attributes)


async def _winner(store: Store, rollout_id: str) -> float | None:
    spans = (await store.query_spans([rollout_id]))[rollout_id]
    span = winning_final((s, s.attributes) for s in sorted(spans, key=lambda s: s.seq or 0))
    return None if span is None else float(span.attributes[semconv.REWARD_VALUE])


@pytest.mark.asyncio
class RewardPrecedenceConformance:
    """Final rewards: precedence by source (client > judge > agent), never by arrival order."""

    @pytest.mark.parametrize("order", ["judge_first", "client_first"])
    async def test_client_beats_judge_in_either_order(self, store: Store, order: str) -> None:
        await store.enqueue([t.RolloutSpec(rollout_id="s")])
        (claim,) = await store.dequeue("w")
        aid = claim.attempt.attempt_id
        judge = final_reward_span("s", aid, 1.0, "judge")
        client = final_reward_span("s", aid, 0.0, "client")
        if order == "judge_first":
            assert await store.add_spans([judge]) == 1
            assert await store.add_spans([client]) == 1
        else:
            assert await store.add_spans([client]) == 1
            assert await store.add_spans([judge]) == 0, "a judge's score after the client's rating is refused"
        assert await _winner(store, "s") == 0.0

    async def test_every_order_of_sources_gives_the_highest(self, store: Store) -> None:
        sources = [("agent", None, 0.25), ("judge", "judge", 0.5), ("client", "client", 0.75)]
        orders = list(itertools.permutations(sources))
        await store.enqueue([t.RolloutSpec(rollout_id=f"p{i}") for i in range(len(orders))])
        claims = await store.dequeue("w", limit=len(orders))
        attempt = {c.rollout.rollout_id: c.attempt.attempt_id for c in claims}
        for i, order in enumerate(orders):
            rid = f"p{i}"
            for _, source, value in order:
                await store.add_spans([final_reward_span(rid, attempt[rid], value, source)])
            assert await _winner(store, rid) == 0.75, [name for name, _, _ in order]
            stored = (await store.query_spans([rid]))[rid]
            ranks = [
                s.attributes.get(semconv.FEEDBACK_SOURCE, "agent") for s in sorted(stored, key=lambda s: s.seq or 0)
            ]
            # nothing written after the client's rating except a later client rating
            assert ranks[-1] == "client"

    async def test_same_source_latest_wins_and_one_batch_obeys_the_rule(self, store: Store) -> None:
        await store.enqueue([t.RolloutSpec(rollout_id="s")])
        (claim,) = await store.dequeue("w")
        aid = claim.attempt.attempt_id
        batch = [
            final_reward_span("s", aid, 0.1, "client"),
            final_reward_span("s", aid, 0.9, "judge"),  # outranked inside the same batch
            final_reward_span("s", aid, 0.3, "client"),  # the client changed its mind
        ]
        assert await store.add_spans(batch) == 2
        assert await _winner(store, "s") == 0.3

    async def test_racing_judge_and_client_writes(self, store: Store) -> None:
        """Concurrent writers (the judge sweep and the feedback API) still end with the client's value."""
        n = 8
        await store.enqueue([t.RolloutSpec(rollout_id=f"q{i}") for i in range(n)])
        claims = await store.dequeue("w", limit=n)
        writes = []
        for c in claims:
            rid, aid = c.rollout.rollout_id, c.attempt.attempt_id
            writes += [
                store.add_spans([final_reward_span(rid, aid, 1.0, "judge")]),
                store.add_spans([final_reward_span(rid, aid, 0.0, "client")]),
            ]
        await asyncio.gather(*writes)
        for c in claims:
            assert await _winner(store, c.rollout.rollout_id) == 0.0
