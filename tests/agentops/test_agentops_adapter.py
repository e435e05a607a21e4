"""agentbolt-agentops with the real AgentOps SDK: the conformance suite, an agent whose own code
calls ``agentops.init()`` (no API key) before or after agentbolt installs its capture — AgentOps'
processors and agentbolt both receive the spans, every LLM call is captured once with exact ids
and joined to AgentOps' span, agent and tool names arrive, and no connection leaves the machine —
and AgentOps chosen as the runner's tracer. Each runs in a fresh interpreter: ``agentops.init()``
patches LLM clients and agent frameworks for the whole process."""

from __future__ import annotations

import json
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
    env.pop("AGENTOPS_API_KEY", None)
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "agentops_conformance_suite.py", "-q", "-p", "no:cacheprovider"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=HERE,
        env=env,
    )
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    assert "15 passed" in out.stdout, out.stdout[-2000:]


FLUSH = """
def flush():  # make AgentOps export what it queued (spans, metrics) while the guard watches
    from agentops.sdk.core import tracer
    tracer.provider.force_flush()
    tracer._meter_provider.force_flush()
"""

SCRIPT = textwrap.dedent(
    """
    import instrumented_harness
    {flush}
    def setup():
        import ao_agents
        exporter = ao_agents.init_agentops()
        return lambda: [s.name for s in exporter.get_finished_spans()]

    def load():
        import ao_agents as ao
        return ao.calc_team, ao.calc_backend(), ao.calc_tasks(2)

    instrumented_harness.main(setup, load, order={order!r}, flush=flush)
    """
)


@pytest.mark.parametrize("order", ["before", "after"])
def test_agentops_init_before_or_after_agentbolt(order: str) -> None:
    summary = instrumented_harness.run(SCRIPT.format(order=order, flush=FLUSH), HERE)
    assert summary["outbound"] == []  # neither spans nor metrics went to AgentOps' cloud
    assert summary["failed"] == 0
    # AgentOps' own processors received the spans.
    assert {"calc_team.workflow", "solver.agent", "checker.agent", "calculator.tool", "openai.chat.completion"} <= set(
        summary["user_exporter"]
    )
    for rollout in summary["rollouts"]:
        assert rollout["status"] == "succeeded" and rollout["reward"] == 1.0
        assert rollout["gateway_calls"] == rollout["llm_spans"] == rollout["llm_spans_joined"] == 3
        assert rollout["attempt_ok"]
        assert rollout["agents"] == ["checker", "solver"]
        assert rollout["tools"] == ["calculator"]
        assert rollout["adapters"] == ["agentops"]
    assert [name for name, _ in summary["transitions"]] == ["solver", "solver", "checker"] * 2
    assert {source for _, source in summary["transitions"]} == {"exact"}


KEY_SCRIPT = textwrap.dedent(
    """
    from agentbolt.testing.outbound import OutboundGuard
    from agentbolt_agentops import AgentOpsAdapter
    import agentops
    from agentops.sdk.core import tracer

    AgentOpsAdapter().instrument()
    from opentelemetry import metrics

    with OutboundGuard() as guard:
        agentops.init(auto_start_session=False)
        metrics.get_meter("agent").create_counter("calls").add(1)  # something for AgentOps' metric exporter
        tracer._meter_provider.force_flush()
    print("ATTEMPTS", guard.attempts)
    """
)


@pytest.mark.parametrize("key", [None, "a-key-the-user-configured"])
def test_agentops_exports_to_its_cloud_only_with_an_api_key(key: str | None) -> None:
    env = dict(os.environ)
    env.pop("AGENTOPS_API_KEY", None)
    # A refused export is retried with backoff until OpenTelemetry's exporter timeout (10 s by
    # default, once at the flush and once at exit); the first attempt, which is what this test
    # looks for, comes before any retry, so a 1 s timeout checks the same and takes 4 s, not 18.
    env["OTEL_EXPORTER_OTLP_TIMEOUT"] = "1"
    if key is not None:
        env["AGENTOPS_API_KEY"] = key
    out = subprocess.run([sys.executable, "-c", KEY_SCRIPT], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("ATTEMPTS")]
    if key is None:
        assert line == "ATTEMPTS []"
    else:  # the user configured AgentOps' cloud: it is tried (and refused by the guard, offline)
        assert "agentops.ai" in line


EXIT_SCRIPT = textwrap.dedent(
    """
    import atexit, json, os
    from agentbolt.testing.outbound import OutboundGuard

    guard = OutboundGuard().__enter__()  # on to the end: its report runs after AgentOps' exit handlers
    atexit.register(lambda: os.write(1, ("ATTEMPTS " + json.dumps(guard.attempts) + "\\n").encode()))
    if {adapter}:
        from agentbolt_agentops import AgentOpsAdapter
        AgentOpsAdapter().instrument()
    import agentops
    agentops.init()  # the default trace starts; it ends at exit, and AgentOps uploads what was printed
    print("what the agent printed")
    """
)


@pytest.mark.parametrize(("adapter", "key"), [(True, None), (False, None), (True, "a-key-the-user-configured")])
def test_agentops_uploads_nothing_at_exit_without_an_api_key(adapter: bool, key: str | None) -> None:
    env = dict(os.environ)
    env.pop("AGENTOPS_API_KEY", None)
    env["OTEL_EXPORTER_OTLP_TIMEOUT"] = "1"  # refused exports' retries (see above)
    if key is not None:
        env["AGENTOPS_API_KEY"] = key
    script = EXIT_SCRIPT.format(adapter=adapter)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("ATTEMPTS ")]
    attempts = json.loads(line[len("ATTEMPTS ") :])
    if adapter and key is None:
        assert attempts == []  # no log upload, no export, no DNS lookup
    else:  # AgentOps alone uploads the printed log at exit (api.agentops.ai); with a key, as configured
        assert "resolve api.agentops.ai" in attempts


TRACER_SCRIPT = textwrap.dedent(
    """
    import instrumented_harness
    {flush}
    def setup():  # the agent never mentions AgentOps: the runner's tracer initializes it
        return lambda: []

    def load():
        import openai_calc
        return openai_calc.calc_agent, openai_calc.calc_backend(), openai_calc.calc_tasks(2)

    instrumented_harness.main(setup, load, order="after", adapters=["agentops-tracer"], flush=flush)
    """
)


def test_agentops_as_the_rollouts_tracer() -> None:
    summary = instrumented_harness.run(TRACER_SCRIPT.format(flush=FLUSH), HERE)
    assert summary["outbound"] == []
    assert summary["failed"] == 0
    for rollout in summary["rollouts"]:
        assert rollout["status"] == "succeeded" and rollout["reward"] == 1.0
        # AgentOps' OpenAI instrumentation recorded each call; joined to the gateway's exact ids.
        assert rollout["gateway_calls"] == rollout["llm_spans"] == rollout["llm_spans_joined"] == 2
        assert rollout["adapters"] == ["agentops"]
    assert {source for _, source in summary["transitions"]} == {"exact"}


def test_plugin_module_imports_nothing_heavy() -> None:
    code = (
        "import sys, agentbolt_agentops.plugin, agentbolt_agentops; "
        "print(sorted(m for m in ('agentops', 'openai', 'wrapt') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_agentops_tracer_is_opt_in() -> None:
    from agentbolt.plugins import default_plugins

    adapters = default_plugins().adapters
    assert "agentops" in adapters and "agentops-tracer" in adapters
    assert adapters.get("agentops")().auto and not adapters.get("agentops-tracer")().auto
