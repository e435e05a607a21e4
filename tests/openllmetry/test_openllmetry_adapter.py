"""agentbolt-openllmetry with the real Traceloop SDK: the conformance suite, and an agent whose own
code calls ``Traceloop.init`` before or after agentbolt installs its capture — both exporters
receive the spans, every LLM call is captured once with exact ids and joined to OpenLLMetry's
span, agent and tool names arrive, nothing leaves the machine. Each runs in a fresh interpreter:
``Traceloop.init`` patches the OpenAI client for the whole process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import instrumented_harness
import pytest

HERE = Path(__file__).parent


def test_conformance_suite_passes() -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "openllmetry_conformance_suite.py", "-q", "-p", "no:cacheprovider"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=HERE,
        env=env,
    )
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    assert "15 passed" in out.stdout, out.stdout[-2000:]


SCRIPT = textwrap.dedent(
    """
    import instrumented_harness

    def setup():
        import ol_agents
        exporter = ol_agents.init_traceloop()
        return lambda: [s.name for s in exporter.get_finished_spans()]

    def load():
        import ol_agents as ol
        return ol.calc_team, ol.calc_backend(), ol.calc_tasks(2)

    instrumented_harness.main(setup, load, order={order!r})
    """
)


@pytest.mark.parametrize("order", ["before", "after"])
def test_traceloop_init_before_or_after_agentbolt(order: str) -> None:
    summary = instrumented_harness.run(SCRIPT.format(order=order), HERE)
    assert summary["outbound"] == []
    assert summary["failed"] == 0
    assert {"calc_team.workflow", "solver.agent", "checker.agent", "calculator.tool", "openai.chat"} <= set(
        summary["user_exporter"]
    )
    for rollout in summary["rollouts"]:
        assert rollout["status"] == "succeeded" and rollout["reward"] == 1.0
        assert rollout["gateway_calls"] == rollout["llm_spans"] == rollout["llm_spans_joined"] == 3
        assert rollout["attempt_ok"]
        assert rollout["agents"] == ["checker", "solver"]
        assert rollout["tools"] == ["calculator"]
        assert rollout["adapters"] == ["openllmetry"]
        assert rollout["kinds"] == ["agent", "llm", "operation", "tool"]
    assert [name for name, _ in summary["transitions"]] == ["solver", "solver", "checker"] * 2
    assert {source for _, source in summary["transitions"]} == {"exact"}


NO_KEY_SCRIPT = textwrap.dedent(
    """
    import instrumented_harness

    def setup():  # Traceloop's quick start, without an API key: no exporter of the user's
        from traceloop.sdk import Traceloop
        Traceloop.init(app_name="calc")
        return lambda: []

    def load():
        import ol_agents as ol
        return ol.calc_team, ol.calc_backend(), ol.calc_tasks(2)

    instrumented_harness.main(setup, load, order={order!r})
    """
)


@pytest.mark.parametrize("order", ["before", "after"])
def test_traceloop_without_a_key_connects_nowhere(order: str) -> None:
    """From the process's start to its last exit handler (uploads at exit included), no
    connection or DNS lookup beyond loopback: not the Traceloop SDK's exporters, metrics, logs or
    image uploader, not OpenLLMetry's instrumentations."""
    env_key = os.environ.pop("TRACELOOP_API_KEY", None)
    try:
        summary = instrumented_harness.run(NO_KEY_SCRIPT.format(order=order), HERE)
    finally:
        if env_key is not None:
            os.environ["TRACELOOP_API_KEY"] = env_key
    assert summary["outbound"] == []
    assert summary["failed"] == 0
    assert [r["gateway_calls"] for r in summary["rollouts"]] == [3, 3]


SENDS_SCRIPT = textwrap.dedent(
    """
    import atexit, socket
    import instrumented_harness

    def connect(address):
        with socket.socket() as sock:
            sock.settimeout(1)
            try:
                sock.connect((address, 443))
            except OSError:
                pass

    def resolve(name):
        try:
            socket.getaddrinfo(name, 443)
        except OSError:
            pass

    def setup():  # a setup that connects out during the run and looks a name up at exit
        connect("192.0.2.1")
        atexit.register(resolve, "api.traceloop.com")  # registered after the harness's report: runs before it
        return lambda: []

    def load():
        import ol_agents as ol
        return ol.calc_team, ol.calc_backend(), ol.calc_tasks(1)

    instrumented_harness.main(setup, load, order="before")
    """
)


def test_the_harness_reports_what_leaves_during_the_run_and_at_exit() -> None:
    """The control for the ``outbound == []`` assertions above: the harness's guard records an
    attempt made during the run and one made by an exit handler registered after it."""
    summary = instrumented_harness.run(SENDS_SCRIPT, HERE)
    assert summary["outbound"] == ["connect 192.0.2.1:443", "resolve api.traceloop.com"]
    assert summary["failed"] == 0


def test_plugin_module_imports_nothing_heavy() -> None:
    code = (
        "import sys, agentbolt_openllmetry.plugin, agentbolt_openllmetry; "
        "print(sorted(m for m in ('traceloop', 'opentelemetry.semconv_ai', 'openai') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_legacy_flattened_prompt_becomes_input_messages_with_the_gateway_fingerprint() -> None:
    """OpenLLMetry's ``gen_ai.prompt.{i}.*`` (conventions up to 1.36) is read as the span's input
    messages, whose fingerprint is the one the gateway records for the same request."""
    from agentbolt import semconv
    from agentbolt import types as t
    from agentbolt.lightningrl.spans import input_messages
    from agentbolt.request_fingerprint import fingerprints
    from agentbolt_openllmetry._hooks import OpenLLMetryHooks

    span = t.Span.create(
        "openai.chat",
        attributes={
            "llm.request.type": "chat",
            "gen_ai.prompt.0.role": "system",
            "gen_ai.prompt.0.content": "You solve arithmetic.",
            "gen_ai.prompt.1.role": "user",
            "gen_ai.prompt.1.content": "What is 1 + 3?",
        },
    ).model_copy(update={"scope": "opentelemetry.instrumentation.openai.v1"})
    record = OpenLLMetryHooks("openllmetry").map_span(span)
    assert record is not None and record.kind == semconv.KIND_LLM
    mapped = span.model_copy(update={"attributes": {**span.attributes, **record.attributes}})
    request = [{"role": "system", "content": "You solve arithmetic."}, {"role": "user", "content": "What is 1 + 3?"}]
    assert fingerprints(input_messages(mapped)) == fingerprints(request)
