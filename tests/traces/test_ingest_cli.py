"""``agentbolt ingest`` as a user runs it: a process receiving OTLP from the real exporter, a line
per trace, feedback over HTTP, a summary on Ctrl-C, the rollouts in the store afterwards."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from agentbolt import types as t
from agentbolt.store import open_store

SCORER = '''
def score(rollout):
    """1.0 when an agent span named solver is in the trace."""
    return 1.0 if rollout.attribute("agent.name") == "solver" else 0.0
'''


def lines(stream: object, into: queue.Queue[str]) -> None:
    for line in stream:  # type: ignore[attr-defined]
        into.put(line.rstrip("\n"))


def wait_for(q: queue.Queue[str], pattern: str, timeout: float = 60.0) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        try:
            line = q.get(timeout=0.5)
        except queue.Empty:
            continue
        seen.append(line)
        if (match := re.search(pattern, line)) is not None:
            return match
    raise AssertionError(f"no line matching {pattern!r} in {seen}")


async def test_agentbolt_ingest_receives_traces_and_shows_their_status(tmp_path: Path) -> None:
    (tmp_path / "my_scoring.py").write_text(SCORER)
    db = tmp_path / "traces.db"
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "COLUMNS": "200"}
    command = ["ingest", "--run", "prod", "--store", f"sqlite:///{db}", "--port", "0", "--grpc-port", "0"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentbolt.cli", *command, "--quiet", "0", "--scorer", "my_scoring:score"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    out: queue.Queue[str] = queue.Queue()
    err: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lines, args=(proc.stdout, out), daemon=True).start()
    threading.Thread(target=lines, args=(proc.stderr, err), daemon=True).start()
    try:
        url = wait_for(err, r"OTLP/HTTP on (http://127\.0\.0\.1:\d+)/v1/traces").group(1)
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{url}/v1/traces")))
        tracer = provider.get_tracer("agent")
        with (
            tracer.start_as_current_span(
                "solver", attributes={"openinference.span.kind": "AGENT", "agent.name": "solver"}
            ) as root,
            tracer.start_as_current_span("ChatCompletion", attributes={"openinference.span.kind": "LLM"}),
        ):
            pass
        provider.shutdown()
        trace_id = format(root.get_span_context().trace_id, "032x")
        line = wait_for(out, rf"trace {trace_id} complete: .*").group(0)
        assert "2 spans" in line and "1 LLM calls (0 retokenized, excluded: 1 no_token_ids: no tokenizer" in line
        assert "agents solver" in line and "reward 1 (agent)" in line
        answer = httpx.post(f"{url}/v1/feedback", json={"feedback_id": "f", "trace_id": trace_id, "reward": 0.0})
        assert answer.status_code == 200
        wait_for(out, rf"trace {trace_id} complete: .*reward 0 \(client\)")
        assert httpx.get(f"{url}/v1/traces/status").json()["rollouts"][0]["spans"] == 2
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
    wait_for(out, r"1 traced rollouts")
    store = open_store(f"sqlite:///{db}")
    try:
        (rollout,) = await store.get_rollouts([f"prod:trace:{trace_id}"])
        assert rollout.status == t.RolloutStatus.SUCCEEDED and rollout.metadata["agentbolt.source"] == "trace"
    finally:
        await store.close()
