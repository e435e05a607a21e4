"""The store conformance suite: every backend must pass it, third-party ones included.

Subclass :class:`StoreConformance` in a test module and implement :meth:`make_store`::

    from agentbolt.testing.store_conformance import StoreConformance

    class TestMyStore(StoreConformance):
        async def make_store(self, tmp_path):
            return MyStore(f"mystore://{tmp_path}")

The tests use short leases and timeouts (fractions of a second) and real sleeps to let them
pass; they assert on states, never on how long something took. Needs ``pytest`` and
``pytest-asyncio`` (``pip install 'agentbolt[testing]'``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from .. import semconv
from .. import types as t
from ..errors import (
    ConflictError,
    InvalidTransitionError,
    NotFoundError,
    SchemaError,
    StaleAttemptError,
    UserError,
)
from ..store.base import AttemptReport, Store
from .reward_conformance import RewardPrecedenceConformance
from .run_conformance import RunStoreConformance

__all__ = ["StoreConformance"]

SHORT_LEASE = 0.3
"""Lease (seconds) the expiry tests use; they then wait :data:`PAST_LEASE`."""
PAST_LEASE = 0.7


def specs(n: int, prefix: str = "r", **kwargs: object) -> list[t.RolloutSpec]:
    return [t.RolloutSpec(rollout_id=f"{prefix}{i}", task_id=f"task-{i}", input={"i": i}, **kwargs) for i in range(n)]


def llm_span(rollout_id: str, attempt_id: str | None = None, **attrs: t.AttributeValue) -> t.Span:
    return t.Span.create(
        "chat smollm",
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        attributes={
            semconv.GEN_AI_OPERATION_NAME: "chat",
            semconv.PROMPT_TOKEN_IDS: [1, 2, 3, 4],
            semconv.RESPONSE_TOKEN_IDS: [5, 6],
            semconv.RESPONSE_LOGPROBS: [-0.5, -1.25],
            **attrs,
        },
    )


@pytest.mark.asyncio
class StoreConformance(RunStoreConformance, RewardPrecedenceConformance):
    """Behaviour every :class:`~agentbolt.store.Store` backend shares (runs included)."""

    async def make_store(self, tmp_path: Path) -> Store:
        """Open a fresh, empty store. Subclasses must implement this."""
        raise NotImplementedError

    @pytest_asyncio.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[Store]:
        store = await self.make_store(tmp_path)
        try:
            yield store
        finally:
            await store.close()

    # -- enqueue --------------------------------------------------------------------------------

    async def test_enqueue_returns_queued_rollouts_in_order(self, store: Store) -> None:
        out = await store.enqueue(specs(3, group_id="g1", mode=t.RolloutMode.VAL, timeout_s=9.0, metadata={"k": "v"}))
        assert [r.rollout_id for r in out] == ["r0", "r1", "r2"]
        for i, r in enumerate(out):
            assert r.status is t.RolloutStatus.QUEUED
            assert r.input == {"i": i} and r.task_id == f"task-{i}"
            assert r.group_id == "g1" and r.mode is t.RolloutMode.VAL
            assert r.timeout_s == 9.0 and r.metadata == {"k": "v"}
            assert r.attempt_count == 0 and r.current_attempt_id is None
        assert await store.get_rollouts(["r2", "r0"]) == [out[2], out[0]]

    async def test_enqueue_generates_unique_ids(self, store: Store) -> None:
        out = await store.enqueue([t.RolloutSpec(input=i) for i in range(20)])
        assert len({r.rollout_id for r in out}) == 20

    async def test_enqueue_is_idempotent_on_ids(self, store: Store) -> None:
        first = await store.enqueue(specs(2))
        again = await store.enqueue(specs(3))
        assert again[:2] == first
        counts = await store.count_rollouts()
        assert counts[t.RolloutStatus.QUEUED] == 3

    async def test_enqueue_conflict_writes_nothing(self, store: Store) -> None:
        await store.enqueue(specs(1))
        batch = [t.RolloutSpec(rollout_id="new"), t.RolloutSpec(rollout_id="r0", input="different")]
        with pytest.raises(ConflictError, match="r0"):
            await store.enqueue(batch)
        with pytest.raises(NotFoundError):
            await store.get_rollouts(["new"])

    async def test_enqueue_unknown_resources_version(self, store: Store) -> None:
        with pytest.raises(NotFoundError, match="resources version"):
            await store.enqueue([t.RolloutSpec(rollout_id="a"), t.RolloutSpec(rollout_id="b", resources_version=7)])
        assert (await store.query_rollouts()).items == []

    async def test_enqueue_empty(self, store: Store) -> None:
        assert await store.enqueue([]) == []

    # -- dequeue --------------------------------------------------------------------------------

    async def test_dequeue_fifo_with_limit(self, store: Store) -> None:
        await store.enqueue(specs(5))
        first = await store.dequeue("w1", limit=2)
        second = await store.dequeue("w2", limit=10)
        assert [c.rollout.rollout_id for c in first] == ["r0", "r1"]
        assert [c.rollout.rollout_id for c in second] == ["r2", "r3", "r4"]
        assert await store.dequeue("w3") == []

    async def test_claim_starts_an_attempt(self, store: Store) -> None:
        await store.add_resources(t.Resources(prompts={"p": "1"}))
        await store.add_resources(t.Resources(prompts={"p": "2"}))
        await store.enqueue(
            [t.RolloutSpec(rollout_id="pinned", resources_version=1), t.RolloutSpec(rollout_id="free", timeout_s=60)]
        )
        claims = await store.dequeue("worker-a", limit=2, lease_s=20)
        by_id = {c.rollout.rollout_id: c for c in claims}
        pinned, free = by_id["pinned"], by_id["free"]
        assert pinned.rollout.resources_version == 1
        assert free.rollout.resources_version == 2
        for c in claims:
            assert c.rollout.status is t.RolloutStatus.RUNNING
            assert c.rollout.attempt_count == 1 and c.rollout.current_attempt_id == c.attempt.attempt_id
            assert c.rollout.started_at is not None
            assert c.attempt.index == 1 and c.attempt.worker_id == "worker-a"
            assert c.attempt.status is t.AttemptStatus.RUNNING
            assert c.attempt.lease_expires_at == pytest.approx(c.attempt.started_at + 20)
        assert pinned.attempt.deadline_at is None
        assert free.attempt.deadline_at == pytest.approx(free.attempt.started_at + 60)
        assert await store.get_attempts("free") == [free.attempt]
        assert (await store.get_rollouts(["free"]))[0] == free.rollout

    async def test_dequeue_by_mode(self, store: Store) -> None:
        await store.enqueue(specs(2, prefix="t") + specs(2, prefix="v", mode=t.RolloutMode.VAL))
        val = await store.dequeue("w", limit=5, mode=t.RolloutMode.VAL)
        assert [c.rollout.rollout_id for c in val] == ["v0", "v1"]
        rest = await store.dequeue("w", limit=5)
        assert [c.rollout.rollout_id for c in rest] == ["t0", "t1"]

    async def test_dequeue_claims_only_the_given_rollouts(self, store: Store) -> None:
        await store.enqueue(specs(4) + specs(1, prefix="v", mode=t.RolloutMode.VAL))
        claims = await store.dequeue("w", limit=5, rollout_ids=["r2", "nope", "r1", "r2"])
        assert [c.rollout.rollout_id for c in claims] == ["r1", "r2"]  # oldest first, unknown ids skipped
        assert await store.dequeue("w", rollout_ids=["r1"]) == []  # no longer queued
        assert await store.dequeue("w", rollout_ids=["v0"], mode=t.RolloutMode.TRAIN) == []
        assert await store.dequeue("w", rollout_ids=[]) == []
        rest = await store.dequeue("w", limit=10)  # the others are still queued, in order
        assert [c.rollout.rollout_id for c in rest] == ["r0", "r3", "v0"]

    async def test_dequeue_rejects_bad_arguments(self, store: Store) -> None:
        with pytest.raises(UserError):
            await store.dequeue("w", limit=0)
        with pytest.raises(UserError):
            await store.dequeue("w", lease_s=0)

    async def test_concurrent_dequeues_never_share_a_rollout(self, store: Store) -> None:
        await store.enqueue(specs(60))
        results = await asyncio.gather(*(store.dequeue(f"w{i}", limit=3) for i in range(30)))
        claimed = [c.rollout.rollout_id for claims in results for c in claims]
        assert len(claimed) == 60 and len(set(claimed)) == 60

    async def test_dequeue_waits_for_work(self, store: Store) -> None:
        assert await store.dequeue("w", wait_s=0.2) == []

        async def enqueue_later() -> None:
            await asyncio.sleep(0.2)
            await store.enqueue(specs(1))

        task = asyncio.create_task(enqueue_later())
        # Woken by the enqueue: the bound only keeps a broken wake-up from hanging the test.
        claims = await asyncio.wait_for(store.dequeue("w", wait_s=60), timeout=10)
        await task
        assert [c.rollout.rollout_id for c in claims] == ["r0"]

    async def test_requeue_wakes_a_waiting_worker(self, store: Store) -> None:
        await store.enqueue([t.RolloutSpec(rollout_id="r", max_attempts=2)])
        (claim,) = await store.dequeue("w1")
        waiter = asyncio.create_task(store.dequeue("w2", wait_s=60))
        await asyncio.sleep(0.1)
        error = t.ErrorInfo(kind=t.ErrorKind.INFRASTRUCTURE, type="x", message="gateway down")
        await store.finish_attempt(claim.attempt.attempt_id, t.AttemptStatus.FAILED, error=error)
        (again,) = await asyncio.wait_for(waiter, timeout=10)
        assert again.rollout.rollout_id == "r" and again.attempt.index == 2

    # -- heartbeats, leases, timeouts -----------------------------------------------------------

    async def test_heartbeat_extends_the_lease(self, store: Store) -> None:
        await store.enqueue(specs(1))
        # heartbeats for longer than one lease keep the attempt running; the lease leaves ~1 s of
        # slack per heartbeat so a loaded machine (HTTP backends, CI) does not lose it
        lease = 1.5
        (claim,) = await store.dequeue("w", lease_s=lease)
        for _ in range(4):
            await asyncio.sleep(lease / 4)
            (state,) = await store.heartbeat([claim.attempt.attempt_id], lease_s=lease)
            assert state.status is t.AttemptStatus.RUNNING, f"attempt {state.status} after a heartbeat"
        await store.sweep()
        (state,) = await store.heartbeat([claim.attempt.attempt_id], lease_s=30)
        assert state.status is t.AttemptStatus.RUNNING
        assert state.heartbeat_at is not None and state.lease_expires_at is not None
        assert state.lease_expires_at > state.heartbeat_at

    async def test_heartbeat_unknown_attempt(self, store: Store) -> None:
        with pytest.raises(NotFoundError):
            await store.heartbeat(["nope"])

    async def test_expired_lease_requeues_then_fails(self, store: Store) -> None:
        await store.enqueue([t.RolloutSpec(rollout_id="r", max_attempts=2)])
        (first,) = await store.dequeue("w1", lease_s=SHORT_LEASE)
        await asyncio.sleep(PAST_LEASE)
        assert await store.sweep() == 1
        (attempt,) = await store.get_attempts("r")
        assert attempt.status is t.AttemptStatus.LOST
        assert attempt.error is not None and attempt.error.kind is t.ErrorKind.LOST
        (rollout,) = await store.get_rollouts(["r"])
        assert rollout.status is t.RolloutStatus.QUEUED
        # The worker that lost its lease sees it, and its late report is rejected.
        (seen,) = await store.heartbeat([first.attempt.attempt_id])
        assert seen.status is t.AttemptStatus.LOST
        with pytest.raises(StaleAttemptError):
            await store.finish_attempt(first.attempt.attempt_id, t.AttemptStatus.SUCCEEDED, reward=1.0)
        (second,) = await store.dequeue("w2", lease_s=SHORT_LEASE)
        assert second.attempt.index == 2 and second.rollout.attempt_count == 2
        await asyncio.sleep(PAST_LEASE)
        await store.sweep()
        (rollout,) = await store.get_rollouts(["r"])
        assert rollout.status is t.RolloutStatus.FAILED
        assert rollout.error is not None and rollout.error.kind is t.ErrorKind.LOST

    async def test_lease_expiry_applies_without_a_sweep(self, store: Store) -> None:
        await store.enqueue(specs(1))
        (claim,) = await store.dequeue("w", lease_s=SHORT_LEASE)
        await asyncio.sleep(PAST_LEASE)
        (seen,) = await store.heartbeat([claim.attempt.attempt_id])  # no explicit sweep
        assert seen.status is t.AttemptStatus.LOST

    async def test_timeout_is_enforced(self, store: Store) -> None:
        await store.enqueue([t.RolloutSpec(rollout_id="slow", timeout_s=SHORT_LEASE)])
        (claim,) = await store.dequeue("w", lease_s=30)
        await asyncio.sleep(PAST_LEASE)
        (seen,) = await store.heartbeat([claim.attempt.attempt_id])
        assert seen.status is t.AttemptStatus.TIMED_OUT
        (rollout,) = await store.get_rollouts(["slow"])
        assert rollout.status is t.RolloutStatus.FAILED
        assert rollout.error is not None and rollout.error.kind is t.ErrorKind.TIMEOUT
        with pytest.raises(StaleAttemptError):
            await store.finish_attempt(claim.attempt.attempt_id, t.AttemptStatus.SUCCEEDED, reward=1.0)
        assert (await store.get_rollouts(["slow"]))[0] == rollout  # the late report changed nothing
        assert await store.dequeue("w") == []  # never runs again

    async def test_late_success_past_deadline_is_rejected(self, store: Store) -> None:
        await store.enqueue([t.RolloutSpec(rollout_id="slow", timeout_s=SHORT_LEASE)])
        (claim,) = await store.dequeue("w", lease_s=30)
        await asyncio.sleep(PAST_LEASE)
        with pytest.raises(StaleAttemptError):  # no sweep ran: the deadline itself decides
            await store.finish_attempt(claim.attempt.attempt_id, t.AttemptStatus.SUCCEEDED, reward=1.0)
        (rollout,) = await store.get_rollouts(["slow"])
        assert rollout.status is t.RolloutStatus.FAILED and rollout.final_reward is None

    # -- finishing attempts ---------------------------------------------------------------------

    async def test_success(self, store: Store) -> None:
        await store.enqueue(specs(1))
        (claim,) = await store.dequeue("w")
        rollout = await store.finish_attempt(claim.attempt.attempt_id, t.AttemptStatus.SUCCEEDED, reward=0.75)
        assert rollout.status is t.RolloutStatus.SUCCEEDED and rollout.final_reward == 0.75
        assert rollout.ended_at is not None and rollout.error is None
        (attempt,) = await store.get_attempts("r0")
        assert attempt.status is t.AttemptStatus.SUCCEEDED and attempt.ended_at is not None
        assert (await store.get_rollouts(["r0"]))[0] == rollout

    async def test_finish_attempts_writes_spans_and_ends_together(self, store: Store) -> None:
        await store.enqueue(specs(3))
        claims = await store.dequeue("w", limit=3)
        a0, a1, a2 = (c.attempt.attempt_id for c in claims)
        failed = t.ErrorInfo(kind=t.ErrorKind.AGENT, type="ValueError", message="bad")
        reports = [
            AttemptReport(attempt_id=a1, status=t.AttemptStatus.FAILED, error=failed),
            AttemptReport(attempt_id=a0, status=t.AttemptStatus.SUCCEEDED, reward=0.5),
        ]
        out = await store.finish_attempts(reports, spans=[llm_span("r0", a0), llm_span("r1", a1), llm_span("r2", a2)])
        assert [(r.rollout_id, r.status) for r in out] == [
            ("r1", t.RolloutStatus.FAILED),
            ("r0", t.RolloutStatus.SUCCEEDED),
        ]
        assert out[1].final_reward == 0.5 and await store.get_rollouts(["r1", "r0"]) == out
        assert {k: len(v) for k, v in (await store.query_spans(["r0", "r1", "r2"])).items()} == {
            "r0": 1,
            "r1": 1,
            "r2": 1,
        }
        assert await store.finish_attempts([], spans=[llm_span("r2", a2)]) == []  # spans alone, like add_spans
        (running,) = await store.get_rollouts(["r2"])
        assert running.status is t.RolloutStatus.RUNNING

    async def test_finish_attempts_is_all_or_nothing(self, store: Store) -> None:
        await store.enqueue(specs(2))
        c0, c1 = await store.dequeue("w", limit=2)
        a0, a1 = c0.attempt.attempt_id, c1.attempt.attempt_id
        await store.finish_attempt(a1, t.AttemptStatus.SUCCEEDED)
        ok = AttemptReport(attempt_id=a0, status=t.AttemptStatus.SUCCEEDED, reward=1.0)
        bad_batches: list[tuple[list[AttemptReport], list[t.Span], type[Exception]]] = [
            ([ok, AttemptReport(attempt_id=a1, status=t.AttemptStatus.SUCCEEDED)], [], StaleAttemptError),
            ([ok, ok], [], StaleAttemptError),  # the second report of one attempt
            ([ok, AttemptReport(attempt_id="ghost", status=t.AttemptStatus.FAILED)], [], NotFoundError),
            ([ok], [llm_span("r0", a0), llm_span("ghost")], NotFoundError),
        ]
        for reports, spans, error in bad_batches:
            with pytest.raises(error):
                await store.finish_attempts(reports, spans=[llm_span("r0", a0), *spans])
        (r0,) = await store.get_rollouts(["r0"])
        assert r0.status is t.RolloutStatus.RUNNING and (await store.query_spans(["r0"]))["r0"] == []

    async def test_agent_failure_is_not_retried(self, store: Store) -> None:
        await store.enqueue([t.RolloutSpec(rollout_id="r", max_attempts=3)])
        (claim,) = await store.dequeue("w")
        try:
            raise ValueError("bad tool output")
        except ValueError as exc:
            error = t.ErrorInfo.from_exception(exc)
        rollout = await store.finish_attempt(claim.attempt.attempt_id, t.AttemptStatus.FAILED, error=error)
        assert rollout.status is t.RolloutStatus.FAILED
        assert rollout.error is not None and rollout.error.type == "ValueError"
        assert "bad tool output" in (rollout.error.traceback or "")
        assert await store.dequeue("w") == []

    async def test_infrastructure_failure_is_retried_up_to_max_attempts(self, store: Store) -> None:
        await store.enqueue([t.RolloutSpec(rollout_id="r", max_attempts=2)])
        error = t.ErrorInfo(kind=t.ErrorKind.INFRASTRUCTURE, type="upstream_500", message="backend answered 500")
        (c1,) = await store.dequeue("w")
        r = await store.finish_attempt(c1.attempt.attempt_id, t.AttemptStatus.FAILED, error=error)
        assert r.status is t.RolloutStatus.QUEUED and r.error == error
        (c2,) = await store.dequeue("w")
        assert c2.attempt.index == 2
        r = await store.finish_attempt(c2.attempt.attempt_id, t.AttemptStatus.FAILED, error=error)
        assert r.status is t.RolloutStatus.FAILED and r.attempt_count == 2
        assert [a.status for a in await store.get_attempts("r")] == [t.AttemptStatus.FAILED] * 2

    async def test_double_report_is_rejected(self, store: Store) -> None:
        await store.enqueue(specs(1))
        (claim,) = await store.dequeue("w")
        done = await store.finish_attempt(claim.attempt.attempt_id, t.AttemptStatus.SUCCEEDED, reward=1.0)
        with pytest.raises(StaleAttemptError):
            await store.finish_attempt(claim.attempt.attempt_id, t.AttemptStatus.FAILED)
        assert (await store.get_rollouts(["r0"]))[0] == done

    async def test_finish_rejects_bad_input(self, store: Store) -> None:
        await store.enqueue(specs(1))
        (claim,) = await store.dequeue("w")
        with pytest.raises(UserError):
            await store.finish_attempt(claim.attempt.attempt_id, t.AttemptStatus.TIMED_OUT)
        with pytest.raises(NotFoundError):
            await store.finish_attempt("no-such-attempt", t.AttemptStatus.SUCCEEDED)
        (rollout,) = await store.get_rollouts(["r0"])
        assert rollout.status is t.RolloutStatus.RUNNING

    # -- cancel ---------------------------------------------------------------------------------

    async def test_cancel_queued_and_running(self, store: Store) -> None:
        await store.enqueue(specs(2))
        (claim,) = await store.dequeue("w")
        out = await store.cancel(["r0", "r1"], reason="step abandoned")
        assert [r.status for r in out] == [t.RolloutStatus.CANCELLED] * 2
        assert out[0].error is not None and out[0].error.kind is t.ErrorKind.CANCELLED
        (seen,) = await store.heartbeat([claim.attempt.attempt_id])
        assert seen.status is t.AttemptStatus.FAILED
        assert seen.error is not None and seen.error.kind is t.ErrorKind.CANCELLED
        with pytest.raises(StaleAttemptError):
            await store.finish_attempt(claim.attempt.attempt_id, t.AttemptStatus.SUCCEEDED)
        assert await store.dequeue("w") == []
        assert await store.cancel(["r1"]) == [out[1]]  # idempotent

    async def test_cancel_finished_is_rejected_atomically(self, store: Store) -> None:
        await store.enqueue(specs(2))
        (claim,) = await store.dequeue("w")
        await store.finish_attempt(claim.attempt.attempt_id, t.AttemptStatus.SUCCEEDED, reward=1.0)
        with pytest.raises(InvalidTransitionError, match="r0"):
            await store.cancel(["r1", "r0"])
        assert [r.status for r in await store.get_rollouts(["r0", "r1"])] == [
            t.RolloutStatus.SUCCEEDED,
            t.RolloutStatus.QUEUED,
        ]
        with pytest.raises(NotFoundError):
            await store.cancel(["missing"])

    # -- reads ----------------------------------------------------------------------------------

    async def test_get_unknown(self, store: Store) -> None:
        await store.enqueue(specs(1))
        with pytest.raises(NotFoundError, match="zzz"):
            await store.get_rollouts(["r0", "zzz"])
        with pytest.raises(NotFoundError):
            await store.get_attempts("zzz")

    async def test_query_filters_and_pagination(self, store: Store) -> None:
        await store.enqueue(specs(7, group_id="a") + specs(3, prefix="v", group_id="b", mode=t.RolloutMode.VAL))
        claims = await store.dequeue("w", limit=2)
        for c in claims:
            await store.finish_attempt(c.attempt.attempt_id, t.AttemptStatus.SUCCEEDED, reward=1.0)
        seen: list[str] = []
        cursor = None
        while True:
            page = await store.query_rollouts(limit=3, cursor=cursor)
            seen += [r.rollout_id for r in page.items]
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        assert seen == [f"r{i}" for i in range(7)] + ["v0", "v1", "v2"]
        queued = await store.query_rollouts(status=t.RolloutStatus.QUEUED, group_id="a")
        assert [r.rollout_id for r in queued.items] == ["r2", "r3", "r4", "r5", "r6"]
        done = await store.query_rollouts(status=[t.RolloutStatus.SUCCEEDED, t.RolloutStatus.FAILED])
        assert [r.rollout_id for r in done.items] == ["r0", "r1"]
        val = await store.query_rollouts(mode=t.RolloutMode.VAL)
        assert [r.rollout_id for r in val.items] == ["v0", "v1", "v2"]
        counts = await store.count_rollouts()
        assert counts[t.RolloutStatus.SUCCEEDED] == 2 and counts[t.RolloutStatus.QUEUED] == 8
        assert (await store.count_rollouts(group_id="b"))[t.RolloutStatus.QUEUED] == 3
        with pytest.raises(UserError):
            await store.query_rollouts(cursor="not-a-cursor")
        with pytest.raises(UserError):
            await store.query_rollouts(status="bogus")  # type: ignore[arg-type]  # bad input on purpose

    # -- spans ----------------------------------------------------------------------------------

    async def test_spans_get_increasing_seq_and_round_trip(self, store: Store) -> None:
        await store.enqueue(specs(2))
        (claim,) = await store.dequeue("w")
        aid = claim.attempt.attempt_id
        batch = [llm_span("r0", aid, **{"gen_ai.response.id": f"c{i}"}) for i in range(5)] + [llm_span("r1")]
        assert await store.add_spans(batch) == 6
        assert await store.add_spans([llm_span("r0", aid, **{"gen_ai.response.id": "c5"})]) == 1
        got = await store.query_spans(["r0", "r1"])
        seqs = [s.seq for s in got["r0"] if s.seq is not None]
        assert len(seqs) == 6 and seqs == sorted(seqs) and len(set(seqs)) == 6
        assert [s.attributes["gen_ai.response.id"] for s in got["r0"]] == [f"c{i}" for i in range(6)]
        for original, stored in zip(batch[:5], got["r0"], strict=False):
            assert stored.model_copy(update={"seq": None}) == original
        assert got["r1"][0].attempt_id is None and got["r1"][0].rollout_id == "r1"

    async def test_span_writes_are_idempotent(self, store: Store) -> None:
        await store.enqueue(specs(2))
        span = llm_span("r0")
        assert await store.add_spans([span, span]) == 1
        assert await store.add_spans([span]) == 0
        twin = span.model_copy(update={"rollout_id": "r1"})  # same span id, other rollout
        assert await store.add_spans([twin]) == 1
        got = await store.query_spans(["r0", "r1"])
        assert len(got["r0"]) == 1 and len(got["r1"]) == 1

    async def test_bad_span_batches_write_nothing(self, store: Store) -> None:
        await store.enqueue(specs(2))
        (claim,) = await store.dequeue("w")
        with pytest.raises(NotFoundError, match="ghost"):
            await store.add_spans([llm_span("r0"), llm_span("ghost")])
        with pytest.raises(NotFoundError):  # an attempt of another rollout
            await store.add_spans([llm_span("r1"), llm_span("r1", claim.attempt.attempt_id)])
        with pytest.raises(SchemaError):
            await store.add_spans([llm_span("r0"), llm_span("r0").model_copy(update={"rollout_id": None})])
        assert await store.query_spans(["r0", "r1"]) == {"r0": [], "r1": []}

    async def test_span_queries(self, store: Store) -> None:
        await store.enqueue([t.RolloutSpec(rollout_id="r", max_attempts=2)])
        error = t.ErrorInfo(kind=t.ErrorKind.INFRASTRUCTURE, type="x", message="retry")
        (c1,) = await store.dequeue("w")
        await store.add_spans([llm_span("r", c1.attempt.attempt_id), t.Span.create("note", rollout_id="r")])
        await store.finish_attempt(c1.attempt.attempt_id, t.AttemptStatus.FAILED, error=error)
        (c2,) = await store.dequeue("w")
        await store.add_spans([llm_span("r", c2.attempt.attempt_id)])
        everything = (await store.query_spans(["r"]))["r"]
        latest = (await store.query_spans(["r"], latest_attempt_only=True))["r"]
        assert len(everything) == 3
        assert [s.attempt_id for s in latest] == [None, c2.attempt.attempt_id]
        after = (await store.query_spans(["r"], after_seq=everything[0].seq))["r"]
        assert after == everything[1:]
        with pytest.raises(NotFoundError):
            await store.query_spans(["r", "missing"])

    async def test_large_token_lists_round_trip(self, store: Store) -> None:
        await store.enqueue(specs(1))
        ids = list(range(4096))
        logprobs = [-(i % 7) / 3 for i in range(4096)]
        tokens: dict[str, t.AttributeValue] = {semconv.RESPONSE_TOKEN_IDS: ids, semconv.RESPONSE_LOGPROBS: logprobs}
        span = llm_span("r0", None, **tokens)
        await store.add_spans([span])
        (stored,) = (await store.query_spans(["r0"]))["r0"]
        assert stored.attributes[semconv.RESPONSE_TOKEN_IDS] == ids
        assert stored.attributes[semconv.RESPONSE_LOGPROBS] == logprobs

    # -- resources ------------------------------------------------------------------------------

    async def test_resources_versions(self, store: Store) -> None:
        assert await store.get_resources() is None
        llm = t.LLMEndpoint(base_url="http://127.0.0.1:1/v1", model="m", sampling={"temperature": 0.7})
        v1 = await store.add_resources(t.Resources(llm=llm, prompts={"system": "be brief"}))
        v2 = await store.add_resources(t.Resources(extra={"step": 2}))
        assert (v1.version, v2.version) == (1, 2)
        assert v1.created_at is not None and v1.llm == llm
        assert await store.get_resources() == v2
        assert await store.get_resources(1) == v1
        with pytest.raises(NotFoundError):
            await store.get_resources(3)

    # -- waiting --------------------------------------------------------------------------------

    async def test_wait_for_rollouts(self, store: Store) -> None:
        await store.enqueue(specs(3))
        claims = await store.dequeue("w", limit=3)

        async def finish_later() -> None:
            await asyncio.sleep(0.2)
            for c in claims:
                await store.finish_attempt(c.attempt.attempt_id, t.AttemptStatus.SUCCEEDED, reward=1.0)

        task = asyncio.create_task(finish_later())
        done = await store.wait_for_rollouts(["r0", "r1", "r2"], timeout=30)
        await task
        assert [r.status for r in done] == [t.RolloutStatus.SUCCEEDED] * 3
        again = await store.wait_for_rollouts(["r0"], timeout=0)
        assert again[0].status is t.RolloutStatus.SUCCEEDED

    async def test_wait_times_out_with_current_states(self, store: Store) -> None:
        await store.enqueue(specs(1))
        states = await store.wait_for_rollouts(["r0"], timeout=0.2)
        assert states[0].status is t.RolloutStatus.QUEUED
        with pytest.raises(NotFoundError):
            await store.wait_for_rollouts(["nope"], timeout=0.1)

    async def test_wait_sees_expiry_by_the_sweeper(self, store: Store) -> None:
        await store.enqueue([t.RolloutSpec(rollout_id="r", timeout_s=SHORT_LEASE)])
        await store.dequeue("w", lease_s=30)

        async def sweep_later() -> None:
            await asyncio.sleep(PAST_LEASE)
            await store.sweep()

        task = asyncio.create_task(sweep_later())
        (state,) = await store.wait_for_rollouts(["r"], timeout=30)
        await task
        assert state.status is t.RolloutStatus.FAILED

    # -- purge ----------------------------------------------------------------------------------

    async def test_purge(self, store: Store) -> None:
        await store.enqueue(specs(3))
        claims = await store.dequeue("w", limit=2)
        for c in claims:
            await store.add_spans([llm_span(c.rollout.rollout_id, c.attempt.attempt_id)])
            await store.finish_attempt(c.attempt.attempt_id, t.AttemptStatus.SUCCEEDED, reward=1.0)
        with pytest.raises(InvalidTransitionError, match="r2"):
            await store.purge(rollout_ids=["r0", "r2"])
        assert len((await store.query_spans(["r0"]))["r0"]) == 1  # nothing purged
        assert await store.purge(rollout_ids=["r0"]) == 1
        with pytest.raises(NotFoundError):
            await store.get_rollouts(["r0"])
        assert await store.purge(older_than_s=3600) == 0
        assert await store.purge(older_than_s=0) == 1  # r1 ended; r2 is still queued
        assert [r.rollout_id for r in (await store.query_rollouts()).items] == ["r2"]
        with pytest.raises(UserError):
            await store.purge()

    # -- concurrency ----------------------------------------------------------------------------

    async def test_many_workers_and_span_writers(self, store: Store) -> None:
        n = 120
        await store.enqueue(specs(n))
        finished: list[str] = []

        async def worker(w: int) -> None:
            while True:
                claims = await store.dequeue(f"w{w}", limit=2, lease_s=30)
                if not claims:
                    return
                for c in claims:
                    rid, aid = c.rollout.rollout_id, c.attempt.attempt_id
                    await store.add_spans([llm_span(rid, aid) for _ in range(3)])
                    await store.heartbeat([aid])
                    await store.add_spans([llm_span(rid, aid)])
                    done = await store.finish_attempt(aid, t.AttemptStatus.SUCCEEDED, reward=float(w))
                    finished.append(done.rollout_id)

        await asyncio.gather(*(worker(w) for w in range(12)))
        assert sorted(finished) == sorted(f"r{i}" for i in range(n))
        spans = await store.query_spans([f"r{i}" for i in range(n)])
        assert all(len(v) == 4 for v in spans.values())
        counts = await store.count_rollouts()
        assert counts[t.RolloutStatus.SUCCEEDED] == n
        assert all(r.attempt_count == 1 for r in await store.get_rollouts([f"r{i}" for i in range(n)]))

    async def test_closed_store_refuses_work(self, tmp_path: Path) -> None:
        store = await self.make_store(tmp_path)
        await store.close()
        with pytest.raises(UserError, match="closed"):
            await store.enqueue(specs(1))
