"""The gateway's local call log (``Gateway(call_log=DIR)``): an answered call is in the log
before the client has the answer, whatever the store is doing; a gateway started on the
directory after a crash adds those calls to the store; a live gateway's segments are left alone;
segments are deleted once their spans are stored. Crashes are played by closing a log's files the
way the kernel does when the process dies (no clean-up); the real ``kill -9`` is
tests/core/online/test_serve_crash.py."""

from __future__ import annotations

import asyncio
import fcntl
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentbolt import semconv
from agentbolt import types as t
from agentbolt._tasks import cancel_and_wait
from agentbolt.gateway import Gateway
from agentbolt.gateway.call_log import CallLog, _read
from agentbolt.store import Store, open_store
from agentbolt.store.memory import MemoryStore
from agentbolt.testing.fake_llm import FakeLLM, FakeLLMServer


def die(log: CallLog) -> None:
    """What the kernel does to a killed process's log: its descriptors (and locks) go, files stay."""
    segments = [*log._closed, *([log._current] if log._current else [])]
    for segment in segments:
        os.close(segment.fd)
    log._closed.clear()
    log._current = None


async def crash(gateway: Gateway) -> None:
    """kill -9 of a gateway: its log's files are left as they are, nothing flushed or cleaned up."""
    assert gateway.call_log is not None
    die(gateway.call_log)
    assert gateway._spans._task is not None
    await cancel_and_wait(gateway._spans._task)
    await gateway._server.stop()


def a_span(number: int, attempt_id: str = "a") -> t.Span:
    return t.Span(
        rollout_id="r", attempt_id=attempt_id, trace_id="0" * 32, span_id=f"{number:016x}", name="x", start_time_ns=1
    )


def logged(directory: Path) -> list[t.Span]:
    return [span for path in sorted(directory.glob("calls-*.log")) for span in _read(path)]


async def llm_calls(store: Store, rollout_id: str) -> list[t.Span]:
    spans = (await store.query_spans([rollout_id]))[rollout_id]
    return [s for s in spans if s.attributes.get(semconv.SPAN_KIND_ATTR) == semconv.KIND_LLM]


@pytest.mark.parametrize("stream", [False, True])
async def test_answered_calls_survive_a_crash_while_the_store_has_none_of_them(tmp_path: Path, stream: bool) -> None:
    url, calls = f"sqlite:///{tmp_path / 'store.db'}", tmp_path / "calls"
    store = open_store(url)
    await store.enqueue([t.RolloutSpec(rollout_id="r")])
    (claim,) = await store.dequeue("w")
    store._add_spans = _never  # type: ignore[method-assign]  # a store that takes no span meanwhile
    async with FakeLLMServer(FakeLLM(default_reply="The answer is 42.")) as server:
        gateway = Gateway(store, [server.base_url], call_log=calls)
        await gateway.start()
        client = openai.AsyncOpenAI(
            base_url=gateway.base_url_for("r", claim.attempt.attempt_id), api_key="k", max_retries=0
        )
        ids = []
        for i in range(5):
            messages: list[Any] = [{"role": "user", "content": f"question {i}"}]
            if stream:
                answer = await client.chat.completions.create(model="m", messages=messages, stream=True)
                chunks = [c async for c in answer]
                ids.append(chunks[0].id)
            else:
                ids.append((await client.chat.completions.create(model="m", messages=messages)).id)
            # the client has the answer: the log has the call, the store none yet
            assert [s.attributes[semconv.GEN_AI_RESPONSE_ID] for s in logged(calls)] == ids
        assert await llm_calls(store, "r") == []
        await crash(gateway)
    await store.close()

    store = open_store(url)  # the gateway restarted on the same database and directory
    restarted = Gateway(store, [], call_log=calls)
    await restarted.start()
    try:
        stored = await llm_calls(store, "r")
        assert sorted(s.attributes[semconv.GEN_AI_RESPONSE_ID] for s in stored) == sorted(ids)
        assert restarted.stats()["calls_recovered"] == 5
        assert logged(calls) == []  # replayed segments are gone; the new one is empty
    finally:
        await restarted.stop()
        await store.close()
    assert list(calls.iterdir()) == []  # a clean stop leaves nothing behind


async def test_calls_dropped_from_a_full_span_buffer_stay_in_the_log_until_a_restart_stores_them(
    tmp_path: Path,
) -> None:
    """The store fails while more calls come than the buffer holds, then recovers: the gateway
    drops the oldest spans from memory, but not from the log; a restart stores every call."""
    url, calls = f"sqlite:///{tmp_path / 'store.db'}", tmp_path / "calls"
    store = open_store(url)
    await store.enqueue([t.RolloutSpec(rollout_id="r")])
    (claim,) = await store.dequeue("w")
    add_spans, failing = store._add_spans, asyncio.Event()
    failing.set()

    async def flaky(spans: Sequence[t.Span]) -> int:
        if failing.is_set():
            raise OSError("the store is unreachable")
        return await add_spans(spans)

    store._add_spans = flaky  # type: ignore[method-assign]
    async with FakeLLMServer(FakeLLM(default_reply="The answer is 42.")) as server:
        gateway = Gateway(store, [server.base_url], call_log=calls, max_buffered_spans=3)
        await gateway.start()
        client = openai.AsyncOpenAI(
            base_url=gateway.base_url_for("r", claim.attempt.attempt_id), api_key="k", max_retries=0
        )
        ids = []
        for i in range(9):
            messages: list[Any] = [{"role": "user", "content": f"question {i}"}]
            ids.append((await client.chat.completions.create(model="m", messages=messages)).id)
        failing.clear()
        await gateway.flush()
        stats = gateway.stats()
        assert stats["spans_dropped"] == 6 and stats["spans_written"] == 3
        assert len(await llm_calls(store, "r")) == 3
        await crash(gateway)
    await store.close()

    store = open_store(url)
    restarted = Gateway(store, [], call_log=calls)
    await restarted.start()
    try:
        stored = await llm_calls(store, "r")
        assert sorted(s.attributes[semconv.GEN_AI_RESPONSE_ID] for s in stored) == sorted(ids)
    finally:
        await restarted.stop()
        await store.close()


async def _never(spans: Sequence[t.Span]) -> int:
    await asyncio.Event().wait()
    return 0


async def test_recovery_is_idempotent_and_leaves_a_live_gateways_segments_alone(tmp_path: Path) -> None:
    store = MemoryStore()
    await store.enqueue([t.RolloutSpec(rollout_id="r")])
    (claim,) = await store.dequeue("w")
    spans = [a_span(i, claim.attempt.attempt_id) for i in range(4)]
    dead, live = CallLog(tmp_path), CallLog(tmp_path)
    dead.open()
    live.open()
    for number, span in enumerate(spans[:3], 1):
        dead.append(span, number)
    live.append(spans[3], 1)
    await store.add_spans(spans[:1])  # one reached the store before the crash
    die(dead)
    (tmp_path / ".new-0123").touch()  # a gateway died between creating a segment and naming it
    assert await CallLog(tmp_path).recover(store) == 3
    assert not (tmp_path / ".new-0123").exists()
    assert sorted(s.span_id for s in (await store.query_spans(["r"]))["r"]) == [s.span_id for s in spans[:3]]
    assert [s.span_id for s in logged(tmp_path)] == [spans[3].span_id]  # the live one's, untouched
    live.close()
    await store.close()


def test_a_torn_last_entry_is_skipped_and_a_damaged_one_is_a_clear_error(tmp_path: Path) -> None:
    log = CallLog(tmp_path)
    log.open()
    span = a_span(1)
    log.append(span, 1)
    assert log._current is not None
    path = log._current.path
    die(log)
    whole = path.read_bytes()
    path.write_bytes(whole + whole[:20])  # the process died inside the second write
    assert [s.span_id for s in _read(path)] == [span.span_id]
    path.write_bytes(whole[:20] + b"\n" + whole)
    with pytest.raises(ValueError, match=r"line 1: unreadable entry .*move the file"):
        _read(path)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.just("append"), st.integers(min_value=0, max_value=6)), max_size=60))
def test_no_unreleased_span_is_ever_missing_from_disk(
    tmp_path_factory: pytest.TempPathFactory, steps: list[str | int]
) -> None:
    """Any order of appends and releases (``k``: the writer stored all but the last ``k``): every
    span not yet released is on disk, and a segment all of whose spans are released is gone."""
    directory = tmp_path_factory.mktemp("log")
    log = CallLog(directory, segment_bytes=600)  # a few entries per segment: many rotations
    log.open()
    appended = done = 0
    for step in steps:
        if step == "append":
            appended += 1
            log.append(a_span(appended), appended)
        else:
            done = max(done, appended - int(step))
            log.release(done)
        on_disk = {int(s.span_id, 16) for s in logged(directory)}
        assert set(range(done + 1, appended + 1)) <= on_disk
        assert len(list(directory.glob("calls-*.log"))) <= 2 + (appended - done)
    log.release(appended)
    assert logged(directory) == []
    log.close()
    assert list(directory.iterdir()) == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.just("append"), st.just("drop"), st.integers(min_value=0, max_value=6)), max_size=60))
def test_a_dropped_span_stays_on_disk_for_the_next_recover(
    tmp_path_factory: pytest.TempPathFactory, steps: list[str | int]
) -> None:
    """Any order of appends, releases and drops (``drop``: the writer's full buffer lets go of its
    oldest span, which counts as done): a dropped span is never released from disk, and once the
    rest of its segment is released the segment is unlocked, for a recover to take."""
    directory = tmp_path_factory.mktemp("log")
    log = CallLog(directory, segment_bytes=600)
    log.open()
    appended = done = 0
    kept: set[int] = set()
    for step in steps:
        if step == "append":
            appended += 1
            log.append(a_span(appended), appended)
        elif step == "drop":
            if done < appended:
                done += 1
                kept.add(done)
                log.keep(done, done)
                log.release(done)
        else:
            done = max(done, appended - int(step))
            log.release(done)
        on_disk = {int(s.span_id, 16) for s in logged(directory)}
        assert set(range(done + 1, appended + 1)) | kept <= on_disk
    log.release(appended)
    assert kept <= {int(s.span_id, 16) for s in logged(directory)}
    if not kept:
        assert logged(directory) == []
    for path in directory.glob("calls-*.log"):  # no live gateway holds a kept one: a recover takes it
        if path.stat().st_size == 0:  # the live current segment
            continue
        fd = os.open(path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    log.close()
