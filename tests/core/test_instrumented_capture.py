"""Core's side of instrumented agents (AgentOps, OpenInference, OpenLLMetry and plain OpenTelemetry
users): a tracer provider set after agentbolt's joins it, span translators, the traceparent that
joins an instrumentation's LLM span to the gateway's, the outbound guard, opt-in adapters."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
from typing import Any, ClassVar

import httpx
import pytest

from agentbolt import hookimpl
from agentbolt.capture.adapters import Adapter, AdapterHooks, instrument_adapters, traceparent_for
from agentbolt.capture.tracing import RolloutContext, rollout_context
from agentbolt.plugins import Plugins
from agentbolt.testing.outbound import OutboundGuard

LATE_PROVIDER = textwrap.dedent(
    """
    import asyncio, json
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from agentbolt import types as t, semconv
    from agentbolt.store import open_store
    from agentbolt.capture.tracing import (RolloutContext, SpanSink, add_span_translator, install_otel,
                                   remove_span_translator, rollout_context)

    ours = install_otel()                       # a runner started first
    exporter = InMemorySpanExporter()
    users = TracerProvider()                    # then the agent's code sets up its own
    users.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(users)            # OpenTelemetry alone would refuse this

    def translate(span):
        if span.name.startswith("tool "):
            return span.model_copy(update={"attributes": {**span.attributes, "translated": True}})
        return None

    async def main():
        store = open_store("memory://")
        await store.enqueue([t.RolloutSpec(rollout_id="r")])
        (c,) = await store.dequeue("w")
        sink = SpanSink(store); sink.start()
        add_span_translator(translate)
        with rollout_context(RolloutContext("r", c.attempt.attempt_id, sink)):
            with trace.get_tracer("global.api").start_as_current_span("tool global"):
                with users.get_tracer("users.tracer").start_as_current_span("tool explicit"):
                    pass
        remove_span_translator(translate)
        with rollout_context(RolloutContext("r", c.attempt.attempt_id, sink)):
            with trace.get_tracer("global.api").start_as_current_span("tool after"):
                pass
        with trace.get_tracer("global.api").start_as_current_span("outside"):
            pass
        await sink.flush()
        spans = (await store.query_spans(["r"]))["r"]
        print(json.dumps({
            "global_is_ours": trace.get_tracer_provider() is ours,
            "stored": sorted(s.name for s in spans),
            "translated": sorted(s.name for s in spans if s.attributes.get("translated")),
            "parents": {s.name: s.parent_span_id for s in spans},
            "ids": {s.name: s.span_id for s in spans},
            "user_exporter": sorted(s.name for s in exporter.get_finished_spans()),
            "attempt_ok": all(s.attempt_id == c.attempt.attempt_id for s in spans),
        }))

    asyncio.run(main())
    """
)


def test_a_provider_set_after_agentbolts_joins_it() -> None:
    out = subprocess.run([sys.executable, "-c", LATE_PROVIDER], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "Overriding of current TracerProvider is not allowed" not in out.stderr
    result = json.loads(out.stdout)
    assert result["global_is_ours"]
    # agentbolt stores the rollout's spans, from the global API and from the user's own tracer ...
    assert result["stored"] == ["tool after", "tool explicit", "tool global"]
    assert result["parents"]["tool explicit"] == result["ids"]["tool global"]
    assert result["attempt_ok"]
    # ... and the user's exporter receives every span, inside rollouts or not.
    assert result["user_exporter"] == ["outside", "tool after", "tool explicit", "tool global"]
    # Translators apply to the spans that end while they are added.
    assert result["translated"] == ["tool explicit", "tool global"]


class _Request:
    def __init__(self, path: str, headers: dict[str, str] | None = None) -> None:
        self.path = path
        self.headers = headers or {}


def test_traceparent_goes_to_the_current_rollouts_gateway_only() -> None:
    from opentelemetry.sdk.trace import TracerProvider

    tracer = TracerProvider().get_tracer("test")
    route = "/rollouts/r1/attempts/a1/v1/chat/completions"
    ctx = RolloutContext("r1", "a1", sink=object())  # type: ignore[arg-type]
    with tracer.start_as_current_span("llm") as span:
        sc = span.get_span_context()
        expected = f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{int(sc.trace_flags):02x}"
        assert traceparent_for(route, {}) is None  # no rollout
        with rollout_context(ctx):
            assert traceparent_for(route, {}) == expected
            assert traceparent_for("/v1/chat/completions", {"x-agentbolt-rollout-id": "r1"}) == expected
            assert traceparent_for("/v1/chat/completions", {}) is None  # another server
            assert traceparent_for("/rollouts/r2/attempts/a9/v1/chat/completions", {}) is None  # another rollout
            assert traceparent_for(route, {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}) is None
    with rollout_context(ctx):
        assert traceparent_for(route, {}) is None  # no current span


class PropagatingHooks(AdapterHooks):
    def install(self) -> None:
        from agentbolt.capture.adapters import propagate_to_gateway

        assert propagate_to_gateway(self)

    def uninstall(self) -> None:
        pass


class PropagatingAdapter(Adapter):
    name: ClassVar[str] = "propagating"
    distribution: ClassVar[str] = "httpx"

    @classmethod
    def make_hooks(cls) -> PropagatingHooks:
        return PropagatingHooks(cls.name)


def test_httpx_requests_carry_the_span_while_an_adapter_propagates() -> None:
    from opentelemetry.sdk.trace import TracerProvider

    seen: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("traceparent"))
        return httpx.Response(200, json={})

    client = httpx.Client(transport=httpx.MockTransport(handler), base_url="http://127.0.0.1:9")
    tracer = TracerProvider().get_tracer("test")
    adapter = PropagatingAdapter()
    with rollout_context(RolloutContext("r1", "a1", sink=object())), tracer.start_as_current_span("llm"):  # type: ignore[arg-type]
        client.post("/rollouts/r1/attempts/a1/v1/chat/completions", json={})
        adapter.instrument()
        try:
            client.post("/rollouts/r1/attempts/a1/v1/chat/completions", json={})
            client.post("/elsewhere", json={})
        finally:
            adapter.uninstrument()
        client.post("/rollouts/r1/attempts/a1/v1/chat/completions", json={})
    assert seen[0] is None and seen[2] is None and seen[3] is None
    assert seen[1] is not None and seen[1].startswith("00-")


def test_outbound_guard_refuses_and_records_what_would_leave_the_machine() -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    with OutboundGuard() as guard:
        with socket.create_connection(server.getsockname(), timeout=5):
            pass  # loopback passes
        with pytest.raises(OSError, match=r"refused resolve example\.invalid"):
            socket.getaddrinfo("example.invalid", 443)
        probe = socket.socket()
        with pytest.raises(OSError, match=r"refused connect 192\.0\.2\.1:80"):
            probe.connect(("192.0.2.1", 80))  # TEST-NET-1: refused before any packet
        probe.close()
    server.close()
    assert guard.attempts == ["resolve example.invalid", "connect 192.0.2.1:80"]
    assert socket.getaddrinfo.__module__ == "socket"  # put back


class OptInHooks(AdapterHooks):
    def install(self) -> None:
        pass

    def uninstall(self) -> None:
        pass


class OptInAdapter(Adapter):
    name: ClassVar[str] = "opt-in"
    distribution: ClassVar[str] = "httpx"
    auto: ClassVar[bool] = False

    @classmethod
    def make_hooks(cls) -> OptInHooks:
        return OptInHooks(cls.name)


def test_opt_in_adapters_are_instrumented_only_when_named() -> None:
    plugins = Plugins(load_entry_points=False)

    class Plugin:
        @hookimpl
        def agentbolt_register_adapters(self, register: Any) -> None:
            register("opt-in", OptInAdapter)

    plugins.register(Plugin(), name="opt-in-plugin")
    assert instrument_adapters(plugins=plugins) == []
    (adapter,) = instrument_adapters(["opt-in"], plugins=plugins)
    try:
        assert adapter.instrumented
    finally:
        adapter.uninstrument()
