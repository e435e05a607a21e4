"""Schemathesis over agentbolt serve's OpenAPI document with a LIVE upstream: forwarding, the
Responses/Messages translations, session recording, streaming and the feedback API are fuzzed
against the fake LLM and against a misbehaving upstream (agentbolt.testing.bad_upstream).

Checked for every generated call: no traceback in any body; no 5xx at all with the well-behaved
upstream; with the misbehaving one, 5xx only as an upstream condition (``agentbolt_upstream_error``).
Checked afterwards in the store (SQLite): every call the gateway forwarded (its answer carries a
span id) is recorded exactly once, as an LLM span of its session's attempt, and nothing else is;
every session is one rollout with one attempt, claimed by the serve process, running or succeeded
as its session is open or closed. A fixed seed and a small budget keep it repeatable in CI.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from itertools import cycle
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.online import OnlineServer, SessionOptions
from agentbolt.online.sessions import META_KEY
from agentbolt.store import RolloutSearch
from agentbolt.testing.bad_upstream import MODES, GarbageUpstream
from agentbolt.testing.fake_llm import FakeLLM, FakeLLMServer

SEED = 20261126
EXAMPLES = 10
TOKEN = "fuzz-token"
LIVE_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages")
SPAN_HEADER = "x-agentbolt-span-id"


class ServeThread:
    """An OnlineServer (and what it needs) on an event loop of its own thread, for sync callers."""

    def __init__(self, build: Callable[[], Awaitable[OnlineServer]]) -> None:
        self._build = build
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.server: OnlineServer | None = None

    def run(self, coro: Awaitable[Any], timeout: float = 120) -> Any:
        future: concurrent.futures.Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)  # type: ignore[arg-type]
        return future.result(timeout)

    def __enter__(self) -> OnlineServer:
        self._thread.start()
        self.server = self.run(self._build())
        self.run(self.server.start())
        return self.server

    def __exit__(self, *exc: object) -> None:
        if self.server is not None:
            self.run(self.server.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


@dataclass
class Calls:
    """What the fuzzer saw: span ids of forwarded calls, and the status of every call."""

    span_ids: list[str] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    server_errors: list[str] = field(default_factory=list)
    answered: dict[str, int] = field(default_factory=dict)
    """Live route (``stream`` marked) -> 200 answers."""


def no_traceback(text: str, where: str) -> None:
    assert "Traceback (most recent call last)" not in text, f"traceback in the answer to {where}"


def _server(tmp_path: Path, upstream: str) -> OnlineServer:
    return OnlineServer(
        f"sqlite:///{tmp_path / 'serve.db'}",
        upstream,
        state_dir=tmp_path / "state",
        token=TOKEN,
        sessions=SessionOptions(idle_s=0.5),  # sessions close during the run: both states are checked
        metrics_every_s=3600,
        gateway_options={"request_timeout_s": 1.0},
    )


_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
    database=None,
    phases=[Phase.explicit, Phase.generate],
    report_multiple_bugs=False,
)


def fuzz(server: OnlineServer, on_call: Callable[[Any, Any], None]) -> int:
    """Every operation of the served document, positive and negative cases; returns operations run."""
    schema = schemathesis.openapi.from_url(f"{server.gateway.url}/openapi.json")
    schema = schema.exclude(path_regex="^/gateway/(drain|flush|pause|upstreams|policy)$|^/rollouts/")
    operations = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        operations += 1
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @given(case=operation.as_strategy(generation_mode=mode))
            @hypothesis_seed(SEED)
            @_SETTINGS
            def run(case: Any) -> None:
                response = case.call(headers={"authorization": f"Bearer {TOKEN}"}, timeout=30)
                no_traceback(response.text, f"{case.method} {case.path}")
                on_call(case, response)

            try:
                run()
            except Unsatisfiable:  # an operation with nothing to get wrong (no body, no parameter)
                assert mode is GenerationMode.NEGATIVE, operation.path
    return operations


def record_call(calls: Calls, case: Any, response: Any) -> None:
    calls.statuses[response.status_code] = calls.statuses.get(response.status_code, 0) + 1
    if case.path in LIVE_ROUTES and response.status_code == 200:
        streamed = isinstance(case.body, dict) and case.body.get("stream") is True
        route = case.path + (" stream" if streamed else "")
        calls.answered[route] = calls.answered.get(route, 0) + 1
    if case.path in LIVE_ROUTES and SPAN_HEADER in response.headers:
        calls.span_ids.extend(response.headers[SPAN_HEADER])  # schemathesis: name -> values
    if response.status_code >= 500:
        calls.server_errors.append(f"{case.method} {case.path} -> {response.status_code}: {response.text[:300]}")


async def check_store(server: OnlineServer, calls: Calls) -> dict[str, int]:
    """The store after the fuzz run: each forwarded call recorded exactly once, sessions consistent."""
    await server.gateway.flush()
    store = server.store
    page = await store.search_rollouts(RolloutSearch(run_id=server.run_id, limit=1000))
    sessions = [r for r in page.items if META_KEY in r.metadata]
    assert len(sessions) == page.total == server.sessions.counters["sessions_opened"]
    spans = await store.query_spans([r.rollout_id for r in sessions]) if sessions else {}
    llm = [s for items in spans.values() for s in items if s.attributes.get(semconv.SPAN_KIND_ATTR) == semconv.KIND_LLM]
    recorded = sorted(s.span_id for s in llm)
    assert len(calls.span_ids) == len(set(calls.span_ids))  # every answer names its own span
    assert recorded == sorted(calls.span_ids)  # each forwarded call recorded once, nothing else
    for rollout in sessions:
        attempts = await store.get_attempts(rollout.rollout_id)
        assert len(attempts) == 1 and rollout.attempt_count == 1, rollout
        attempt = attempts[0]
        assert attempt.worker_id == f"{server.run_id}-sessions"
        assert {s.attempt_id for s in spans[rollout.rollout_id]} <= {attempt.attempt_id}
        session = server.sessions.by_rollout[rollout.rollout_id]
        if session.closed:
            assert rollout.status is t.RolloutStatus.SUCCEEDED and attempt.status is t.AttemptStatus.SUCCEEDED
        else:
            assert rollout.status is t.RolloutStatus.RUNNING and attempt.status is t.AttemptStatus.RUNNING
    return {"sessions": len(sessions), "recorded_calls": len(recorded)}


@pytest.fixture
def fake_served(tmp_path: Path) -> Iterator[ServeThread]:
    with FakeLLMServer(FakeLLM(default_reply="Paris is the capital of France.")) as upstream:

        async def build() -> OnlineServer:
            return _server(tmp_path, upstream.base_url)

        runner = ServeThread(build)
        with runner:
            yield runner


def test_serve_fuzzed_with_a_live_upstream_answers_no_5xx_and_records_every_call_once(
    fake_served: ServeThread,
) -> None:
    server = fake_served.server
    assert server is not None
    calls = Calls()
    operations = fuzz(server, lambda case, response: record_call(calls, case, response))
    assert operations >= 10
    assert calls.server_errors == []
    # forwarding, each translation and streaming really were fuzzed
    assert {r for r in calls.answered if not r.endswith("stream")} == set(LIVE_ROUTES), calls.answered
    assert sum(n for r, n in calls.answered.items() if r.endswith("stream")) > 0, calls.answered
    found = fake_served.run(check_store(server, calls))
    assert found["recorded_calls"] == len(calls.span_ids) and found["sessions"] > 0


def test_serve_fuzzed_with_a_misbehaving_upstream_fails_only_as_upstream_errors(tmp_path: Path) -> None:
    garbage = GarbageUpstream()

    async def build() -> OnlineServer:
        await garbage.start()
        return _server(tmp_path, garbage.base_url)

    modes = cycle(MODES)
    calls = Calls()

    def on_call(case: Any, response: Any) -> None:
        record_call(calls, case, response)
        if response.status_code >= 500:
            assert response.json()["error"]["type"] == "agentbolt_upstream_error", response.text
        garbage.mode = next(modes)  # the next call meets the next misbehaviour

    runner = ServeThread(build)
    with runner as server:
        try:
            fuzz(server, on_call)
            assert calls.statuses.get(502, 0) + calls.statuses.get(504, 0) > 0  # the upstream did misbehave
            runner.run(check_store(server, calls))
        finally:
            runner.run(garbage.stop())
