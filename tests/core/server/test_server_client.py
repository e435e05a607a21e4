"""The ``http://`` store client: retries only where safe, lost answers, event loops."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from collections.abc import AsyncIterator, Callable

import httpx
import pytest
from server_doubles import FaultyTransport, specs

from agentbolt import types as t
from agentbolt.errors import StaleAttemptError, StoreUnavailableError, UserError
from agentbolt.store import AttemptReport, open_store
from agentbolt.store.http import HttpStore
from agentbolt.store.memory import MemoryStore
from agentbolt.store.server import ServerThread

Serve = Callable[..., ServerThread]


@pytest.fixture
def backend() -> MemoryStore:
    """The store behind the server, read directly by the tests (closed by the server)."""
    return MemoryStore(sweep_interval_s=0)


@pytest.fixture
def transport() -> FaultyTransport:
    return FaultyTransport()


@pytest.fixture
async def store(serve: Serve, backend: MemoryStore, transport: FaultyTransport) -> AsyncIterator[HttpStore]:
    client = HttpStore(serve(backend).url, transport=transport, backoff_s=0.01)
    yield client
    await client.close()


def test_urls_and_options() -> None:
    store = open_store("http://user:pw@127.0.0.1:4747/prefix/")
    assert isinstance(store, HttpStore) and store.url == "http://127.0.0.1:4747/prefix"
    assert "pw" not in repr(store)
    with pytest.raises(UserError, match="http://host:4747"):
        HttpStore("http://")
    with pytest.raises(UserError):
        HttpStore("ftp://127.0.0.1:4747")


async def test_unreachable_server_names_the_url_and_what_to_do() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    store = open_store(url, retries=2, backoff_s=0.01)
    with pytest.raises(StoreUnavailableError) as caught:
        await store.get_rollouts(["r0"])
    assert url in str(caught.value) and "agentbolt store serve" in str(caught.value)
    await store.close()


async def test_unsent_requests_are_retried_for_every_method(
    store: HttpStore, backend: MemoryStore, transport: FaultyTransport
) -> None:
    transport.fail("/v1/resources", "refused")
    transport.fail("/v1/resources", "refused")
    resources = await store.add_resources(t.Resources(prompts={"p": "x"}))
    assert resources.version == 1 and (await backend.get_resources()) == resources


async def test_a_sent_add_resources_is_not_repeated(
    store: HttpStore, backend: MemoryStore, transport: FaultyTransport
) -> None:
    transport.fail("/v1/resources", "lost_answer")
    with pytest.raises(StoreUnavailableError, match="may or may not have been applied"):
        await store.add_resources(t.Resources())
    assert (await backend.get_resources()).version == 1  # one version, not two
    transport.fail("/v1/rollouts/purge", "lost_request")
    with pytest.raises(StoreUnavailableError):
        await store.purge(older_than_s=0)


async def test_enqueue_retried_after_a_lost_answer_queues_each_rollout_once(
    store: HttpStore, backend: MemoryStore, transport: FaultyTransport
) -> None:
    transport.fail("/v1/rollouts", "lost_answer")
    out = await store.enqueue([t.RolloutSpec(input=i) for i in range(5)])  # no ids given
    assert len({r.rollout_id for r in out}) == 5
    assert transport.paths.count("/v1/rollouts") == 2
    assert (await backend.count_rollouts())[t.RolloutStatus.QUEUED] == 5


async def test_idempotent_writes_are_retried(
    store: HttpStore, backend: MemoryStore, transport: FaultyTransport
) -> None:
    await backend.enqueue(specs(2))
    (claim,) = await backend.dequeue("w")
    aid = claim.attempt.attempt_id
    transport.fail("/v1/spans", "lost_answer")
    transport.fail("/v1/attempts/heartbeat", "lost_answer")
    transport.fail("/v1/rollouts/cancel", "lost_answer")
    spans = [t.Span.create("call", rollout_id="r0", attempt_id=aid) for _ in range(3)]
    assert await store.add_spans(spans) == 0  # stored by the lost try; the count says what this try added
    assert len((await backend.query_spans(["r0"]))["r0"]) == 3
    (state,) = await store.heartbeat([aid])
    assert state.status is t.AttemptStatus.RUNNING
    (cancelled,) = await store.cancel(["r1"])
    assert cancelled.status is t.RolloutStatus.CANCELLED


@pytest.mark.parametrize("how", ["lost_request", "lost_answer"])
async def test_finish_attempt_survives_a_lost_connection(
    store: HttpStore, backend: MemoryStore, transport: FaultyTransport, how: str
) -> None:
    await backend.enqueue(specs(1))
    (claim,) = await backend.dequeue("w")
    transport.fail("/v1/attempts/finish", how)
    rollout = await store.finish_attempt(claim.attempt.attempt_id, t.AttemptStatus.SUCCEEDED, reward=0.5)
    assert rollout.status is t.RolloutStatus.SUCCEEDED and rollout.final_reward == 0.5
    assert (await backend.get_rollouts(["r0"]))[0] == rollout


async def test_a_recognised_failure_report_returns_the_requeued_rollout(
    store: HttpStore, backend: MemoryStore, transport: FaultyTransport
) -> None:
    await backend.enqueue(specs(1, max_attempts=2))
    (claim,) = await backend.dequeue("w")
    transport.fail("/v1/attempts/finish", "lost_answer")
    error = t.ErrorInfo(kind=t.ErrorKind.INFRASTRUCTURE, type="upstream_500", message="backend answered 500")
    rollout = await store.finish_attempt(claim.attempt.attempt_id, t.AttemptStatus.FAILED, error=error)
    assert rollout.status is t.RolloutStatus.QUEUED and rollout.error == error
    (attempt,) = await backend.get_attempts("r0")
    assert attempt.status is t.AttemptStatus.FAILED and attempt.error == error


async def test_a_batch_of_reports_survives_a_lost_answer(
    store: HttpStore, backend: MemoryStore, transport: FaultyTransport
) -> None:
    await backend.enqueue(specs(2))
    c0, c1 = await backend.dequeue("w", limit=2)
    transport.fail("/v1/attempts/finish-batch", "lost_answer")
    reports = [
        AttemptReport(attempt_id=c0.attempt.attempt_id, status=t.AttemptStatus.SUCCEEDED, reward=1.0),
        AttemptReport(attempt_id=c1.attempt.attempt_id, status=t.AttemptStatus.SUCCEEDED, reward=0.0),
    ]
    span = t.Span.create("s", rollout_id="r0", attempt_id=c0.attempt.attempt_id)
    out = await store.finish_attempts(reports, spans=[span])  # the retry is refused as stale, then recognised
    assert [(r.rollout_id, r.final_reward) for r in out] == [("r0", 1.0), ("r1", 0.0)]
    assert [s.span_id for s in (await backend.query_spans(["r0"]))["r0"]] == [span.span_id]


async def test_a_retried_report_the_store_did_not_take_stays_stale(
    store: HttpStore, backend: MemoryStore, transport: FaultyTransport
) -> None:
    await backend.enqueue(specs(1))
    (claim,) = await backend.dequeue("w")

    async def cancel_meanwhile(_: httpx.Request) -> None:
        await backend.cancel(["r0"], reason="step abandoned")

    transport.fail("/v1/attempts/finish", "lost_request", before=cancel_meanwhile)
    with pytest.raises(StaleAttemptError, match="step abandoned"):
        await store.finish_attempt(claim.attempt.attempt_id, t.AttemptStatus.FAILED)


async def test_a_retried_dequeue_may_orphan_a_claim_until_its_lease_expires(
    store: HttpStore, backend: MemoryStore, transport: FaultyTransport, caplog: pytest.LogCaptureFixture
) -> None:
    await backend.enqueue(specs(2))
    transport.fail("/v1/rollouts/dequeue", "lost_answer")
    with caplog.at_level(logging.WARNING, logger="agentbolt.store.http"):
        (claim,) = await store.dequeue("w", lease_s=0.3)
    assert claim.rollout.rollout_id == "r1"  # r0 went to the lost answer
    assert "lease" in caplog.text
    (orphan,) = await backend.get_rollouts(["r0"])
    assert orphan.status is t.RolloutStatus.RUNNING
    await asyncio.sleep(0.5)
    assert await store.sweep() == 2  # the orphan's lease (and r1's, never renewed) expired
    (lost,) = await backend.get_attempts("r0")
    assert lost.status is t.AttemptStatus.LOST
    (again, _) = await store.dequeue("w2", limit=2)
    assert again.rollout.rollout_id == "r0" and again.attempt.index == 2


async def test_one_store_serves_many_event_loops_and_threads(serve: Serve, backend: MemoryStore) -> None:
    store = HttpStore(serve(backend).url)
    await store.enqueue(specs(1, prefix="main"))

    def in_new_loop(k: int) -> None:
        async def work() -> None:
            await store.enqueue(specs(3, prefix=f"t{k}-"))
            assert len(await store.get_rollouts([f"t{k}-0", "main0"])) == 2

        asyncio.run(work())
        asyncio.run(work())  # a second loop in the same thread: a fresh client, the old one dropped

    threads = [threading.Thread(target=in_new_loop, args=(k,)) for k in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert (await store.count_rollouts())[t.RolloutStatus.QUEUED] == 10
    await store.close()
    with pytest.raises(UserError, match="closed"):
        await store.count_rollouts()
