"""Inside ``background_writes()`` the SQLite store runs an operation on its writer thread, not
inline on the event loop's thread; outside it, inline when the file lock is free. The spans
written either way are the same, and each lands once."""

from __future__ import annotations

import threading
from pathlib import Path

from agentbolt import types as t
from agentbolt.store import open_store
from agentbolt.store.background_writes import background_writes, in_background
from agentbolt.store.sql import SqlStore


def _span(rollout_id: str, attempt_id: str, n: int) -> t.Span:
    return t.Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        trace_id="1" * 32,
        span_id=f"{n + 1:016x}",
        name="llm.call",
        start_time_ns=n,
        end_time_ns=n + 1,
    )


async def test_background_writes_leave_the_calling_thread(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    assert isinstance(store, SqlStore)
    try:
        here = threading.get_ident()
        assert await store._run(lambda conn: threading.get_ident()) == here  # inline: the lock was free
        assert not in_background()
        with background_writes():
            assert in_background()
            assert await store._run(lambda conn: threading.get_ident()) != here
        assert not in_background()

        await store.enqueue([t.RolloutSpec(rollout_id="r")])
        [claim] = await store.dequeue("w", limit=1, lease_s=60)
        attempt = claim.attempt.attempt_id
        await store.add_spans([_span("r", attempt, 0), _span("r", attempt, 1)])
        with background_writes():
            await store.add_spans([_span("r", attempt, 2), _span("r", attempt, 1)])  # span 1 again: idempotent
        spans = (await store.query_spans(["r"]))["r"]
        assert sorted(s.span_id for s in spans) == [f"{n + 1:016x}" for n in range(3)]
    finally:
        await store.close()
