"""Emitters and span capture: attribution through contextvars, OpenTelemetry integration."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap

import pytest

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.capture.emit import (
    NoRolloutWarning,
    emit_exception,
    emit_message,
    emit_object,
    emit_observation,
    emit_reward,
)
from agentbolt.capture.tracing import RolloutContext, SpanSink, current_rollout, rollout_context
from agentbolt.errors import UserError
from agentbolt.store import open_store


async def _setup(n: int = 1) -> tuple[object, SpanSink, list[RolloutContext]]:
    store = open_store("memory://")
    await store.enqueue([t.RolloutSpec(rollout_id=f"r{i}") for i in range(n)])
    claims = await store.dequeue("w", limit=n)
    sink = SpanSink(store, interval_s=0.01)
    sink.start()
    return store, sink, [RolloutContext(c.rollout.rollout_id, c.attempt.attempt_id, sink) for c in claims]


async def test_emitters_record_spans_of_the_current_rollout() -> None:
    store, sink, (ctx,) = await _setup()
    with rollout_context(ctx):
        assert current_rollout() is ctx
        emit_reward(0.5)
        emit_reward({"correct": 1.0, "format": 0.25}, primary="correct", target_response_id="chatcmpl-9", final=True)
        emit_observation({"rows": [1, 2]})
        emit_message("thinking")
        emit_object({"x": 1})
        try:
            raise RuntimeError("db down")
        except RuntimeError as exc:
            emit_exception(exc)
    await sink.flush()
    spans = (await store.query_spans(["r0"]))["r0"]  # type: ignore[attr-defined]
    assert [s.name for s in spans] == [
        "agentbolt.reward",
        "agentbolt.reward",
        "agentbolt.observation",
        "agentbolt.message",
        "agentbolt.object",
        "agentbolt.exception",
    ]
    assert all(s.attempt_id == ctx.attempt_id for s in spans)
    scalar, multi = spans[0].attributes, spans[1].attributes
    assert scalar[semconv.REWARD_VALUE] == 0.5 and scalar[semconv.REWARD_IS_FINAL] is False
    assert multi[semconv.REWARD_VALUE] == 1.0 and multi[semconv.REWARD_PRIMARY] == "correct"
    assert json.loads(multi[semconv.REWARD_DIMENSIONS]) == {"correct": 1.0, "format": 0.25}
    assert multi[semconv.REWARD_TARGET_RESPONSE_ID] == "chatcmpl-9"
    assert json.loads(spans[2].attributes[semconv.OBSERVATION_BODY]) == {"rows": [1, 2]}
    assert spans[5].status.code is t.StatusCode.ERROR and "db down" in spans[5].attributes[semconv.EXCEPTION_STACKTRACE]
    assert ctx.final_reward == 1.0  # the last reward marked final
    await sink.close()


def test_emitting_outside_a_rollout_warns_and_records_nothing() -> None:
    with pytest.warns(NoRolloutWarning, match="outside a rollout"):
        span = emit_reward(1.0)
    assert span.attributes[semconv.REWARD_VALUE] == 1.0


@pytest.mark.parametrize(
    ("reward", "kwargs", "match"),
    [
        (float("nan"), {}, "finite"),
        ("high", {}, "number"),
        ({}, {}, "empty"),
        ({"a": 1.0, "b": 2.0}, {}, "primary="),
        ({"a": 1.0}, {"primary": "z"}, "not one of"),
    ],
)
def test_bad_rewards_are_rejected(reward: object, kwargs: dict, match: str) -> None:
    with pytest.raises(UserError, match=match):
        emit_reward(reward, **kwargs)  # type: ignore[arg-type]


async def test_concurrent_rollouts_keep_their_own_spans() -> None:
    store, sink, contexts = await _setup(20)

    async def agent(ctx: RolloutContext, value: float) -> None:
        with rollout_context(ctx):
            for _ in range(3):
                await asyncio.sleep(0.001)
                emit_reward(value)

    def sync_agent(ctx: RolloutContext, value: float) -> None:
        with rollout_context(ctx):
            emit_reward(value)

    await asyncio.gather(*(agent(ctx, float(i)) for i, ctx in enumerate(contexts[:10])))
    await asyncio.gather(*(asyncio.to_thread(sync_agent, ctx, float(i + 10)) for i, ctx in enumerate(contexts[10:])))
    await sink.flush()
    spans = await store.query_spans([c.rollout_id for c in contexts])  # type: ignore[attr-defined]
    for i, ctx in enumerate(contexts):
        values = {s.attributes[semconv.REWARD_VALUE] for s in spans[ctx.rollout_id]}
        assert values == {float(i)}
    await sink.close()


async def test_operation_records_inputs_outputs_and_errors() -> None:
    # OpenTelemetry's global provider is process-wide: run in a fresh interpreter.
    script = textwrap.dedent(
        """
        import asyncio, json
        from agentbolt import types as t, semconv
        from agentbolt.capture.emit import operation, emit_reward
        from agentbolt.store import open_store
        from agentbolt.capture.tracing import RolloutContext, SpanSink, install_otel, rollout_context

        @operation
        def add(a, b):
            emit_reward(1.0)
            return a + b

        @operation(name="fetch")
        async def fetch(key):
            raise KeyError(key)

        async def main():
            install_otel()
            store = open_store("memory://")
            await store.enqueue([t.RolloutSpec(rollout_id="r")])
            (c,) = await store.dequeue("w")
            sink = SpanSink(store); sink.start()
            with rollout_context(RolloutContext("r", c.attempt.attempt_id, sink)):
                add(2, b=3)
                try:
                    await fetch("k")
                except KeyError:
                    pass
                with operation("grade") as op:
                    op.set_output(0.5)
            await sink.flush()
            spans = (await store.query_spans(["r"]))["r"]
            print(json.dumps([{"name": s.name, "attrs": s.attributes, "status": s.status.code.value,
                               "span_id": s.span_id, "parent": s.parent_span_id, "attempt": s.attempt_id == c.attempt.attempt_id}
                              for s in spans]))
        asyncio.run(main())
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    spans = json.loads(out.stdout)
    ops = {s["attrs"][semconv.OPERATION_NAME]: s for s in spans if s["name"] == semconv.SPAN_OPERATION}
    assert json.loads(ops["add"]["attrs"][semconv.OPERATION_INPUT]) == {"a": 2, "b": 3}
    assert ops["add"]["attrs"][semconv.OPERATION_OUTPUT] == "5"
    assert ops["fetch"]["status"] == "ERROR"
    assert ops["grade"]["attrs"][semconv.OPERATION_OUTPUT] == "0.5"
    reward = next(s for s in spans if s["name"] == semconv.SPAN_REWARD)
    assert reward["parent"] == ops["add"]["span_id"]  # nested under the operation
    assert all(s["attempt"] for s in spans)


OTEL_SCRIPT = """
import asyncio, json
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from agentbolt import types as t, semconv
from agentbolt.store import open_store
from agentbolt.capture.tracing import RolloutContext, SpanSink, install_otel, rollout_context

USER_PROVIDER = {user_provider}
exporter = InMemorySpanExporter()
if USER_PROVIDER:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)

async def main():
    provider = install_otel()
    install_otel()  # idempotent
    tracer = trace.get_tracer("user.code")
    store = open_store("memory://")
    await store.enqueue([t.RolloutSpec(rollout_id="r1"), t.RolloutSpec(rollout_id="r2")])
    claims = await store.dequeue("w", limit=2)
    sink = SpanSink(store); sink.start()
    with tracer.start_as_current_span("outside"):
        pass

    async def agent(claim):
        with rollout_context(RolloutContext(claim.rollout.rollout_id, claim.attempt.attempt_id, sink)):
            with tracer.start_as_current_span("invoke_agent " + claim.rollout.rollout_id) as s:
                s.set_attribute("gen_ai.agent.name", claim.rollout.rollout_id)
                await asyncio.sleep(0.01)
                def in_thread():  # a thread the agent starts itself: attributed through the parent span
                    with tracer.start_as_current_span("thread work"):
                        pass
                import threading, contextvars
                from opentelemetry import context
                token_ctx = context.get_current()
                def run():
                    tok = context.attach(token_ctx)
                    try:
                        in_thread()
                    finally:
                        context.detach(tok)
                th = threading.Thread(target=run); th.start(); th.join()

    await asyncio.gather(*(agent(c) for c in claims))
    await sink.flush()
    spans = await store.query_spans(["r1", "r2"])
    print(json.dumps({{
        "stored": {{rid: sorted(s.name for s in v) for rid, v in spans.items()}},
        "attempts_ok": all(s.attempt_id == next(c.attempt.attempt_id for c in claims if c.rollout.rollout_id == rid)
                           for rid, v in spans.items() for s in v),
        "user_exporter": sorted(s.name for s in exporter.get_finished_spans()),
        "provider_is_users": USER_PROVIDER and provider is trace.get_tracer_provider(),
    }}))

asyncio.run(main())
"""


@pytest.mark.parametrize("user_provider", [False, True])
def test_opentelemetry_spans_reach_the_store(user_provider: bool) -> None:
    out = subprocess.run(
        [sys.executable, "-c", OTEL_SCRIPT.format(user_provider=user_provider)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["stored"] == {"r1": ["invoke_agent r1", "thread work"], "r2": ["invoke_agent r2", "thread work"]}
    assert result["attempts_ok"] is True
    if user_provider:
        # The user's exporter still sees everything, inside rollouts and outside.
        assert result["user_exporter"] == sorted(
            ["outside", "invoke_agent r1", "invoke_agent r2", "thread work", "thread work"]
        )
        assert result["provider_is_users"] is True
    else:
        assert result["user_exporter"] == []  # nothing goes anywhere else unless configured
