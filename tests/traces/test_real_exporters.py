"""Traces of a deployed agent become trainable rollouts: real instrumentations (OpenInference,
OpenLLMetry) around a real ``openai`` client talking to the fake backend directly (no gateway),
the real OTLP exporter over HTTP and gRPC, ``agentbolt ingest``'s receivers at the other end.

Each agent runs in its own process (``traced_agent.py``), as a deployed agent would: its
instrumentation patches ``openai`` for that process only.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.lightningrl import LightningRL
from agentbolt.testing.fake_llm import FakeLLMServer, FakeTokenizer
from agentbolt.traces import META_SOURCE, IngestOptions, IngestThread, SpanTranslation, TracedRollout, TraceIngestor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import openai_calc as calc

AGENT = Path(__file__).with_name("traced_agent.py")
RUN = "calc-prod"


def score(rollout: TracedRollout) -> float:
    """The user's scoring function: 1.0 when the agent's last reply holds the right sum."""
    messages = rollout.trajectory.messages
    question = next(m["content"] for m in messages if m.get("role") == "user")
    a, b = (int(x) for x in question.removeprefix("What is ").removesuffix("?").split(" + "))
    return calc.score(str(messages[-1].get("content") or ""), a + b)


@pytest.fixture
def backend() -> Iterator[tuple[FakeLLMServer, Any]]:
    llm = calc.calc_backend()
    with FakeLLMServer(llm) as server:
        yield server, llm


def ingest(*, group_by: str | None = None) -> IngestThread:
    return IngestThread(
        "memory://",
        lambda store: TraceIngestor(
            store,
            RUN,
            translation=SpanTranslation(FakeTokenizer()),
            options=IngestOptions(group_by=group_by, quiet_s=0.0),
            scorer=score,
        ),
    )


def run_agent(flavor: str, protocol: str, thread: IngestThread, base_url: str, *extra: str) -> dict[str, Any]:
    endpoint = thread.grpc_endpoint if protocol == "grpc" else f"{thread.http_url}/v1/traces"
    done = subprocess.run(
        [
            sys.executable,
            str(AGENT),
            "--flavor",
            flavor,
            "--protocol",
            protocol,
            "--endpoint",
            endpoint,
            "--base-url",
            base_url,
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def stored(thread: IngestThread) -> tuple[list[t.Rollout], dict[str, list[t.Span]]]:
    async def read(ingestor: TraceIngestor) -> tuple[list[t.Rollout], dict[str, list[t.Span]]]:
        rollouts = await ingestor.store.get_rollouts(list(ingestor.groups))
        return rollouts, await ingestor.store.query_spans(list(ingestor.groups))

    return thread.call(read)


def exported_requests(llm: Any) -> list[dict[str, Any]]:
    return [r.body for r in llm.requests if r.path.endswith("/chat/completions")]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("flavor", ["openinference", "openllmetry"])
def test_traces_become_rollouts_with_agents_tools_ids_and_rewards(
    flavor: str, protocol: str, backend: tuple[FakeLLMServer, Any]
) -> None:
    server, llm = backend
    with ingest() as thread:
        sent = run_agent(flavor, protocol, thread, server.base_url, "--tasks", "3")
        thread.call(lambda ingestor: ingestor.complete_all())
        rollouts, spans = stored(thread)

        # one rollout per trace, of the named run, marked as traced
        assert sorted(r.metadata[META_SOURCE] for r in rollouts) == ["trace"] * 3
        assert {r.run_id for r in rollouts} == {RUN}
        assert sorted(r.metadata["agentbolt.trace.key"] for r in rollouts) == sorted(sent["traces"])
        traced = [s for items in spans.values() for s in items if s.name != semconv.SPAN_REWARD]
        assert len(traced) == sent["spans"]  # every exported span stored, once

        # every LLM call retokenized: the ids the backend would have returned, exactly
        tok = FakeTokenizer()
        expected = sorted(tok.render_chat(b["messages"], b.get("tools")) for b in exported_requests(llm))
        calls = [s for s in traced if s.attributes.get(semconv.SPAN_KIND_ATTR) == semconv.KIND_LLM]
        assert len(calls) == sent["llm_spans"] == 6
        assert {s.attributes[semconv.TOKEN_SOURCE] for s in calls} == {"retokenized"}
        assert not [s for s in calls if semconv.TOKEN_DRIFT in s.attributes]
        assert sorted(s.attributes[semconv.PROMPT_TOKEN_IDS] for s in calls) == expected
        tools = [s for s in traced if s.attributes.get(semconv.SPAN_KIND_ATTR) == semconv.KIND_TOOL]
        assert [s.attributes[semconv.GEN_AI_TOOL_NAME] for s in tools] == ["calculator"] * 3

        # LightningRL trains them like any rollout: one transition per LLM span, agent named, rewarded
        batch = LightningRL(credit="final", advantage="grpo", allow_retokenized=True).process(rollouts, spans)
        assert len(batch.transitions) == 6
        assert {tr.agent_name for tr in batch.transitions} == {"solver"}
        assert {tr.token_source for tr in batch.transitions} == {t.TokenSource.RETOKENIZED}
        assert sorted(r.final_reward for r in rollouts) == [1.0, 1.0, 1.0]  # the scorer's

        # feedback by trace id, later: the client's reward wins over the scorer's
        trace_id = sent["traces"][0]
        answer = httpx.post(
            f"{thread.http_url}/v1/feedback",
            json={"feedback_id": "fb-1", "trace_id": trace_id, "reward": -1.0},
        )
        assert answer.status_code == 200, answer.text
        assert (answer.json()["reward"], answer.json()["reward_source"]) == (-1.0, "client")
        again = httpx.post(
            f"{thread.http_url}/v1/feedback", json={"feedback_id": "fb-1", "trace_id": trace_id, "reward": -1.0}
        )
        assert again.status_code == 200
        rollouts, spans = stored(thread)
        rewards = [s for items in spans.values() for s in items if s.name == semconv.SPAN_REWARD]
        assert len(rewards) == 3 + 1  # three scorer rewards, one feedback (its retry stored nothing)
        batch = LightningRL(credit="final", advantage="grpo", allow_retokenized=True).process(rollouts, spans)
        by_rollout = {tr.rollout_id: tr.reward for tr in batch.transitions}
        assert by_rollout[f"{RUN}:trace:{trace_id}"] == -1.0
        assert sorted(by_rollout.values()) == [-1.0, 1.0, 1.0]


@pytest.mark.parametrize(("flavor", "protocol", "seed"), [("openinference", "grpc", 1), ("openllmetry", "http", 2)])
def test_retried_and_reordered_batches_lose_nothing_and_duplicate_nothing(
    flavor: str, protocol: str, seed: int, backend: tuple[FakeLLMServer, Any]
) -> None:
    server, _ = backend
    with ingest() as thread:
        sent = run_agent(flavor, protocol, thread, server.base_url, "--tasks", "3", "--chaos", str(seed))
        thread.call(lambda ingestor: ingestor.complete_all())
        rollouts, spans = stored(thread)
        status = thread.call(_status)
    traced = [s for items in spans.values() for s in items if s.name != semconv.SPAN_REWARD]
    calls = [s for s in traced if s.attributes.get(semconv.SPAN_KIND_ATTR) == semconv.KIND_LLM]
    assert len(traced) == sent["spans"]  # spans stored == unique spans sent
    assert len({(s.rollout_id, s.span_id) for s in traced}) == len(traced)
    assert len(rollouts) == len(sent["traces"]) == 3  # rollouts == traces
    assert len(calls) == sent["llm_spans"]  # calls == LLM spans
    assert sum(row["duplicates"] for row in status) == sent["spans"]  # every batch came twice
    assert sum(row["spans"] for row in status) == sent["spans"]
    batch = LightningRL(credit="final", advantage="grpo", allow_retokenized=True).process(rollouts, spans)
    assert len(batch.transitions) == sent["llm_spans"]


async def _status(ingestor: TraceIngestor) -> list[dict[str, Any]]:
    return ingestor.status()


def test_a_session_named_by_the_agent_groups_its_traces(backend: tuple[FakeLLMServer, Any]) -> None:
    server, _ = backend
    with ingest(group_by="session.id") as thread:
        first = run_agent("openinference", "http", thread, server.base_url, "--tasks", "2", "--session", "chat-7")
        second = run_agent("openinference", "grpc", thread, server.base_url, "--tasks", "1", "--session", "chat-7")
        thread.call(lambda ingestor: ingestor.complete_all())
        rollouts, spans = stored(thread)
        answer = httpx.post(
            f"{thread.http_url}/v1/feedback", json={"feedback_id": "s-1", "session_id": "chat-7", "reward": 0.5}
        )
    assert [r.rollout_id for r in rollouts] == [f"{RUN}:session:chat-7"]
    traced = [s for s in spans[rollouts[0].rollout_id] if s.name != semconv.SPAN_REWARD]
    assert {s.trace_id for s in traced} == set(first["traces"]) | set(second["traces"])
    assert len(traced) == first["spans"] + second["spans"]
    assert answer.status_code == 200 and answer.json()["reward"] == 0.5
