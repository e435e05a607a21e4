"""The trace ingestor on spans shaped as OpenInference exports them: grouping, completion (root span
plus a quiet period, on a fake clock), late spans, exclusions with reasons, restarts, rewards."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.errors import StoreUnavailableError
from agentbolt.lightningrl import LightningRL
from agentbolt.rewards import LLMJudge
from agentbolt.store import RolloutSearch, open_store
from agentbolt.testing.fake_llm import FakeLLMServer, FakeTokenizer
from agentbolt.testing.scripted_judge import ScriptedJudge
from agentbolt.traces import (
    IngestOptions,
    IngestThread,
    SpanTranslation,
    TracedRollout,
    TraceFeedback,
    TraceIngestor,
    UnknownTrace,
    create_ingest_app,
)

TOK = FakeTokenizer()
SYSTEM = "You solve arithmetic."


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def oi_llm(trace: str, span: str, parent: str | None, question: str, answer: str, **usage: int) -> t.Span:
    """An LLM span as OpenInference's OpenAI instrumentation exports it (usage as the backend counts it)."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    attrs: dict[str, Any] = {"openinference.span.kind": "LLM", "llm.model_name": "m", "llm.finish_reason": "stop"}
    for i, m in enumerate(messages):
        attrs[f"llm.input_messages.{i}.message.role"] = m["role"]
        attrs[f"llm.input_messages.{i}.message.content"] = m["content"]
    attrs["llm.output_messages.0.message.role"] = "assistant"
    attrs["llm.output_messages.0.message.content"] = answer
    attrs["llm.token_count.prompt"] = usage.get("prompt", len(TOK.render_chat(messages)))
    attrs["llm.token_count.completion"] = usage.get("completion", len(TOK.encode(answer)))
    return t.Span.create("ChatCompletion", trace_id=trace, span_id=span, parent_span_id=parent, attributes=attrs)


def oi_agent(trace: str, span: str, name: str = "solver") -> t.Span:
    return t.Span.create(
        name, trace_id=trace, span_id=span, attributes={"openinference.span.kind": "AGENT", "agent.name": name}
    )


def oi_tool(trace: str, span: str, parent: str) -> t.Span:
    attrs = {"openinference.span.kind": "TOOL", "tool.name": "calculator", "input.value": '{"expression": "1+1"}'}
    return t.Span.create("calculator", trace_id=trace, span_id=span, parent_span_id=parent, attributes=attrs)


T1 = "a" * 32
T2 = "b" * 32


def trace_spans(trace: str = T1, answer: str = "The answer is 2.") -> list[t.Span]:
    """A root agent span, a tool call and an LLM call under it."""
    p = trace[:8]  # span ids unique across traces, as OpenTelemetry's random ids are
    return [
        oi_agent(trace, p + "1" * 8),
        oi_tool(trace, p + "2" * 8, p + "1" * 8),
        oi_llm(trace, p + "3" * 8, p + "1" * 8, "What is 1 + 1?", answer),
    ]


def ingestor(store: Any, clock: Clock, **kwargs: Any) -> TraceIngestor:
    options = kwargs.pop("options", IngestOptions(quiet_s=10.0, max_open_s=100.0))
    tokenizer = kwargs.pop("tokenizer", TOK)
    return TraceIngestor(store, "prod", translation=SpanTranslation(tokenizer), options=options, clock=clock, **kwargs)


async def stored_spans(ing: TraceIngestor) -> dict[str, list[t.Span]]:
    return await ing.store.query_spans(list(ing.groups))


async def test_a_trace_completes_after_its_root_span_and_a_quiet_period() -> None:
    clock = Clock()
    ing = ingestor(open_store("memory://"), clock)
    await ing.start(keeper=False)
    root, tool, llm = trace_spans()
    await ing.ingest([llm, tool])  # children first: out of order
    clock.now += 50
    assert await ing.complete_due() == []  # no root yet
    await ing.ingest([root])
    clock.now += 9
    assert await ing.complete_due() == []  # root arrived, not quiet long enough
    clock.now += 1
    (done,) = await ing.complete_due()
    assert done.completed and done.rollout_id == f"prod:trace:{T1}"
    (rollout,) = await ing.store.get_rollouts([done.rollout_id])
    assert rollout.status == t.RolloutStatus.SUCCEEDED and rollout.run_id == "prod"
    assert rollout.metadata == {
        "agentbolt.source": "trace",
        "agentbolt.trace.group": "trace",
        "agentbolt.trace.key": T1,
    }
    assert (await ing.store.get_run("prod")).algorithm == "ingest"


async def test_a_new_span_restarts_the_quiet_period_and_late_spans_still_attach() -> None:
    clock = Clock()
    ing = ingestor(open_store("memory://"), clock)
    await ing.start(keeper=False)
    root, tool, llm = trace_spans()
    await ing.ingest([root, tool])
    clock.now += 8
    await ing.ingest([llm])
    clock.now += 8
    assert await ing.complete_due() == []
    clock.now += 2
    assert len(await ing.complete_due()) == 1
    late = oi_llm(T1, "4" * 16, T1[:8] + "1" * 8, "What is 2 + 2?", "4")
    await ing.ingest([late, late])  # late, and resent
    (row,) = ing.status()
    assert (row["state"], row["spans"], row["late"], row["duplicates"], row["llm_calls"]) == ("complete", 4, 1, 1, 2)
    spans = await stored_spans(ing)
    assert [len(v) for v in spans.values()] == [4]
    assert await ing.complete_due() == []  # completed once


async def test_a_trace_whose_root_never_arrives_completes_after_max_open_s() -> None:
    clock = Clock()
    ing = ingestor(open_store("memory://"), clock)
    await ing.start(keeper=False)
    _, tool, llm = trace_spans()
    await ing.ingest([tool, llm])
    clock.now += 99
    assert await ing.complete_due() == []
    clock.now += 1
    (done,) = await ing.complete_due()
    assert done.completion_note == "no root span"


async def test_calls_that_cannot_be_trusted_are_excluded_with_their_reason() -> None:
    clock = Clock()
    ing = ingestor(open_store("memory://"), clock)
    await ing.start(keeper=False)
    drifted = oi_llm(T1, "5" * 16, T1[:8] + "1" * 8, "What is 1 + 1?", "2", prompt=999)  # another template upstream
    bare = t.Span.create(
        "ChatCompletion",
        trace_id=T1,
        span_id="6" * 16,
        parent_span_id=T1[:8] + "1" * 8,
        attributes={"openinference.span.kind": "LLM"},
    )
    await ing.ingest([*trace_spans(), drifted, bare])
    no_tokenizer = ingestor(ing.store, clock, tokenizer=None)
    await no_tokenizer.ingest(trace_spans(T2))
    await ing.complete_all()
    await no_tokenizer.complete_all()
    rows = {r["key"]: r for r in ing.status() + no_tokenizer.status()}
    assert rows[T1]["llm_calls"] == 3 and rows[T1]["retokenized"] == 1
    assert rows[T1]["excluded"] == {
        "token_drift": 1,
        "no_token_ids: the span recorded no input or output messages (enable the instrumentation's content capture)": 1,
    }
    assert list(rows[T2]["excluded"]) == [
        "no_token_ids: no tokenizer: give the policy's tokenizer (agentbolt ingest --tokenizer) to rebuild ids"
    ]
    spans = await ing.store.query_spans([f"prod:trace:{T1}", f"prod:trace:{T2}"])
    drift = next(s for s in spans[f"prod:trace:{T1}"] if s.span_id == "5" * 16)
    assert drift.attributes[semconv.TOKEN_DRIFT].startswith("prompt: ")
    rollouts = await ing.store.get_rollouts(list(spans))
    batch = LightningRL(allow_retokenized=True, missing_reward="fill", fill_value=0.0, allow_empty=True).process(
        rollouts, spans
    )
    assert batch.report.excluded == {"token_drift": 1, "no_token_ids": 2}
    assert len(batch.transitions) == 1  # the one call whose ids check out
    details = {ex.detail for ex in batch.report.examples if ex.reason == "no_token_ids"}
    assert any(d and "no tokenizer" in d for d in details)


async def test_a_restarted_ingestor_resumes_each_trace_from_the_store() -> None:
    clock = Clock()
    store = open_store("memory://")
    first = ingestor(store, clock)
    await first.start(keeper=False)
    root, tool, llm = trace_spans()
    await first.ingest([tool, llm])
    second = ingestor(store, clock)  # a new process: nothing in memory
    await second.start(keeper=False)
    await second.ingest([llm, root])  # a retry of what the first one stored, then the rest
    clock.now += 10
    (done,) = await second.complete_due()
    assert (len(done.span_ids), done.llm_calls, done.duplicates) == (3, 1, 1)
    spans = await stored_spans(second)
    assert {s.attempt_id for s in spans[done.rollout_id]} == {done.attempt_id}
    assert len(await store.get_attempts(done.rollout_id)) == 1


class CountingTranslation(SpanTranslation):
    def __init__(self) -> None:
        super().__init__(TOK)
        self.translated = 0

    def translate(self, span: t.Span) -> t.Span:
        self.translated += 1
        return super().translate(span)


async def test_a_resent_batch_is_counted_without_being_translated_again() -> None:
    clock = Clock()
    translation = CountingTranslation()
    ing = TraceIngestor(open_store("memory://"), "prod", translation=translation, clock=clock)
    await ing.start(keeper=False)
    spans = trace_spans()
    await ing.ingest(spans[1:])
    await ing.ingest(spans)  # an exporter's retry of the first batch, with the root
    (state,) = ing.groups.values()
    assert (translation.translated, len(state.span_ids), state.duplicates, state.llm_calls) == (3, 3, 2, 1)


async def test_feedback_by_trace_id_wins_over_the_scorer_whatever_the_order() -> None:
    clock = Clock()
    calls: list[TracedRollout] = []

    def scorer(rollout: TracedRollout) -> float:
        calls.append(rollout)
        return 1.0 if "2" in str(rollout.trajectory.messages[-1]["content"]) else 0.0

    ing = ingestor(open_store("memory://"), clock, scorer=scorer)
    await ing.start(keeper=False)
    await ing.ingest(trace_spans(T1) + trace_spans(T2, answer="The answer is 3."))
    with pytest.raises(UnknownTrace, match="no span of it arrived"):
        await ing.feedback(TraceFeedback(feedback_id="f0", trace_id="c" * 32, reward=1.0))
    await ing.feedback(TraceFeedback(feedback_id="f1", trace_id=T1, reward=-0.5))  # before completion
    clock.now += 10
    await ing.complete_due()
    await ing.feedback(TraceFeedback(feedback_id="f2", trace_id=T2.upper(), reward=0.25))  # days later
    assert len(calls) == 2
    rows = {r["key"]: r for r in ing.status()}
    assert (rows[T1]["reward"], rows[T1]["reward_source"]) == (-0.5, "client")
    assert (rows[T2]["reward"], rows[T2]["reward_source"]) == (0.25, "client")
    spans = await stored_spans(ing)
    rollouts = await ing.store.get_rollouts(list(spans))
    batch = LightningRL(allow_retokenized=True).process(rollouts, spans)
    assert sorted(tr.reward for tr in batch.transitions) == [-0.5, 0.25]


async def test_a_judge_scores_completed_traces() -> None:
    judge = ScriptedJudge(rubric=lambda req: 10 if "answer is 2" in req.transcript else 0)
    with FakeLLMServer(judge.fake_llm()) as server:
        ing = ingestor(open_store("memory://"), Clock(), judge=LLMJudge(server.base_url, "fake-model"))
        await ing.start(keeper=False)
        await ing.ingest(trace_spans(T1) + trace_spans(T2, answer="The answer is 3."))
        await ing.complete_all()
    rows = {r["key"]: r for r in ing.status()}
    assert rows[T1]["reward_source"] == rows[T2]["reward_source"] == "judge"
    assert rows[T1]["reward"] > rows[T2]["reward"]
    assert "What is 1 + 1?" in judge.rubric_requests[0].transcript


async def test_hostile_rewards_are_refused_where_they_enter() -> None:
    ing = ingestor(open_store("memory://"), Clock())
    await ing.start(keeper=False)
    bad = t.Span.create(
        semconv.SPAN_REWARD,
        trace_id=T1,
        attributes={semconv.SPAN_KIND_ATTR: semconv.KIND_REWARD, semconv.REWARD_VALUE: "1e400"},
    )
    rejected = await ing.ingest([*trace_spans(), bad])
    assert len(rejected) == 1
    assert ing.status()[0]["spans"] == 3
    client = TestClient(create_ingest_app(ing))
    for value in ("1", True, None, [1]):
        answer = client.post("/v1/feedback", json={"feedback_id": "x", "trace_id": T1, "reward": value})
        assert answer.status_code == 422, value
    answer = client.post("/v1/feedback", content=b'{"feedback_id": "x", "trace_id": "%s", "reward": NaN}' % T1.encode())
    assert answer.status_code == 422
    assert client.post("/v1/feedback", json={"feedback_id": "x", "trace_id": T2, "reward": 1}).status_code == 404
    assert client.post("/v1/feedback", json={"feedback_id": "x", "reward": 1}).status_code == 422
    assert client.get("/v1/traces/status").json()["rejected_spans"] == 1


async def test_session_grouping_holds_spans_until_their_trace_names_its_session() -> None:
    clock = Clock()
    ing = ingestor(
        open_store("memory://"), clock, options=IngestOptions(group_by="session.id", quiet_s=0, max_open_s=50)
    )
    await ing.start(keeper=False)
    root, tool, llm = trace_spans(T1)
    await ing.ingest([tool, llm])  # children carry no session attribute
    assert ing.groups == {}
    await ing.ingest([root.model_copy(update={"attributes": {**root.attributes, "session.id": "chat-1"}})])
    root2, tool2, llm2 = (
        s.model_copy(update={"attributes": {**s.attributes, "session.id": "chat-1"}}) for s in trace_spans(T2)
    )
    await ing.ingest([llm2, tool2, root2])
    orphan = oi_llm("d" * 32, "7" * 16, "8" * 16, "Hi?", "Hello.")  # no session, no root, ever
    await ing.ingest([orphan])
    clock.now += 50
    done = await ing.complete_due()
    assert sorted(s.rollout_id for s in done) == ["prod:session:chat-1", f"prod:trace:{'d' * 32}"]
    session = ing.groups["prod:session:chat-1"]
    assert session.trace_ids == {T1, T2} and len(session.span_ids) == 6
    assert json.loads(json.dumps(ing.status()))  # JSON-ready


async def test_spans_held_for_a_session_name_are_stored_when_the_ingestor_stops() -> None:
    clock = Clock()
    store = open_store("memory://")
    options = IngestOptions(group_by="session.id", quiet_s=0, max_open_s=50)
    ing = ingestor(store, clock, options=options)
    await ing.start(keeper=False)
    _, tool, llm = trace_spans(T1)
    await ing.ingest([tool, llm])  # accepted, held in memory: no span names the session yet
    assert ing.groups == {}
    await ing.stop()
    rollout_id = f"prod:trace:{T1}"
    stored = (await store.query_spans([rollout_id])).get(rollout_id, [])
    assert {s.span_id for s in stored} == {tool.span_id, llm.span_id}
    second = ingestor(store, clock, options=options)  # a restart: the exporter's retry lands in the same rollout
    await second.start(keeper=False)
    await second.ingest([llm])
    await second.stop()
    state = second.groups[rollout_id]
    assert (len(state.span_ids), state.duplicates) == (2, 1)
    assert len((await store.query_spans([rollout_id]))[rollout_id]) == 2


async def test_a_restarted_ingestor_knows_which_session_each_stored_trace_joined() -> None:
    """After a restart, a resent child span of a trace that named its session (the child names
    none) joins that session again: stored once, no rollout of its own trace."""
    clock = Clock()
    store = open_store("memory://")
    options = IngestOptions(group_by="session.id", quiet_s=0, max_open_s=50)
    first = ingestor(store, clock, options=options)
    await first.start(keeper=False)
    root, tool, llm = trace_spans(T1)
    await first.ingest([root.model_copy(update={"attributes": {**root.attributes, "session.id": "chat-1"}}), tool])
    await first.ingest([llm])
    await first.stop()
    second = ingestor(store, clock, options=options)  # a new process: nothing in memory
    await second.start(keeper=False)
    await second.ingest([llm])  # an exporter's retry of a child span: it names no session
    await second.stop()
    session_id = "prod:session:chat-1"
    assert list(second.groups) == [session_id] and second.grouping.held == {}
    assert (await store.search_rollouts(RolloutSearch(run_id="prod"))).total == 1  # no prod:trace:{T1}
    assert len((await store.query_spans([session_id]))[session_id]) == 3
    assert (len(second.groups[session_id].span_ids), second.groups[session_id].duplicates) == (3, 1)


class FailingFinish:
    """A store whose first ``finish_attempt`` fails as an unreachable store's does."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.failed = False

    async def finish_attempt(self, *args: Any, **kwargs: Any) -> Any:
        if not self.failed:
            self.failed = True
            raise StoreUnavailableError("the database is restarting")
        return await self._store.finish_attempt(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


async def test_a_completion_that_fails_is_retried_and_rewards_once() -> None:
    clock = Clock()
    calls: list[str] = []

    def scorer(rollout: TracedRollout) -> float:
        calls.append(rollout.rollout_id)
        return 1.0

    ing = ingestor(FailingFinish(open_store("memory://")), clock, scorer=scorer)
    await ing.start(keeper=False)
    await ing.ingest(trace_spans())
    clock.now += 10
    with pytest.raises(StoreUnavailableError):
        await ing.complete_due()
    assert ing.status()[0]["state"] == "open"
    (done,) = await ing.complete_due()  # what the keeper does a second later
    assert done.completed and len(calls) == 2
    spans = await stored_spans(ing)
    assert (
        len([s for s in spans[done.rollout_id] if s.name == semconv.SPAN_REWARD]) == 1
    )  # the retry stored nothing new
    (rollout,) = await ing.store.get_rollouts([done.rollout_id])
    assert rollout.status == t.RolloutStatus.SUCCEEDED and rollout.final_reward == 1.0


async def test_a_failed_call_is_counted_as_lightningrl_counts_it() -> None:
    ing = ingestor(open_store("memory://"), Clock())
    await ing.start(keeper=False)
    root, tool, llm = trace_spans()
    failed = llm.model_copy(update={"status": t.SpanStatus(code=t.StatusCode.ERROR, message="RateLimitError: 429")})
    await ing.ingest([root, tool, failed])
    await ing.complete_all()
    assert ing.status()[0]["excluded"] == {"failed_call": 1}
    spans = await stored_spans(ing)
    rollouts = await ing.store.get_rollouts(list(spans))
    batch = LightningRL(allow_retokenized=True, missing_reward="fill", fill_value=0.0, allow_empty=True).process(
        rollouts, spans
    )
    assert batch.report.excluded == {"failed_call": 1}


def test_an_ingest_thread_that_fails_to_start_leaves_no_thread_behind() -> None:
    def make(store: Any) -> TraceIngestor:
        raise RuntimeError("no ingestor today")

    thread = IngestThread("memory://", make, grpc_port=None, timeout_s=120)
    with pytest.raises(RuntimeError, match="no ingestor today"):
        thread.__enter__()
    assert thread._thread is not None and not thread._thread.is_alive()
