"""One run of an instrumented agent under agentbolt, in a fresh interpreter (OpenTelemetry's
global provider is process-wide): what tests of the AgentOps, OpenInference and OpenLLMetry
adapters assert on.

``python -c "import instrumented_harness as h; h.main(...)"`` is what the tests run: ``setup``
is the user's own instrumentation code (run before or after agentbolt installs its capture, as
``order`` says), the agent runs in ``Trainer.dev`` through the gateway against the fake backend,
every connection that would leave the machine is refused and recorded, from the start of
:func:`main` to the interpreter's last exit handler (uploads an SDK starts at exit count), and a
JSON summary is printed.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
from collections.abc import Callable, Sequence
from typing import Any

from agentbolt import semconv
from agentbolt.capture.tracing import install_otel
from agentbolt.lightningrl import LightningRL
from agentbolt.store.memory import MemoryStore
from agentbolt.testing.fake_llm import FakeLLM, FakeLLMServer
from agentbolt.testing.outbound import OutboundGuard
from agentbolt.trainer import Trainer


def main(
    setup: Callable[[], Callable[[], list[str]]],
    load: Callable[[], tuple[Callable[..., Any], FakeLLM, Sequence[Any]]],
    *,
    order: str,
    adapters: list[str] | None = None,
    flush: Callable[[], Any] | None = None,
) -> None:
    """``setup()`` installs the user's instrumentation and returns a function listing the span
    names its own exporter received; ``load()`` then gives the agent, the fake backend and the
    tasks. ``order``: ``"before"`` (the user's instrumentation first) or ``"after"`` (agentbolt's
    capture first, as when a runner starts before the agent's code sets up its instrumentation).
    ``flush()``, when given, runs after the rollouts, still under the outbound guard: what makes
    the instrumentation export what it queued (its periodic exporters would run later).

    The outbound guard stays on until the process ends: the exit handler registered here runs
    after every one the instrumentation registers later (they run last-in, first-out) and prints
    ``OUTBOUND_AT_EXIT`` with every refused attempt, exit included; :func:`run` reads it."""
    guard = OutboundGuard().__enter__()
    atexit.register(_report_at_exit, guard)
    if order == "after":
        install_otel()
    exported = setup()
    agent, backend, tasks = load()
    store = MemoryStore()
    with FakeLLMServer(backend) as server:
        trainer = Trainer(
            agent,
            store=store,
            runners={"n": 0, "concurrency": 2},
            capture={"adapters": adapters},
            progress=False,
        )
        result = trainer.dev(list(tasks), llm=server.base_url, model="fake-model")
    if flush is not None:
        flush()
    summary = asyncio.run(_summary(store))
    summary["failed"] = result.failed
    summary["user_exporter"] = sorted(set(exported()))
    summary["outbound"] = list(guard.attempts)
    print("SUMMARY " + json.dumps(summary), flush=True)


def _report_at_exit(guard: OutboundGuard) -> None:
    # os.write: an instrumentation may have replaced ``print`` (AgentOps captures stdout).
    os.write(1, ("\nOUTBOUND_AT_EXIT " + json.dumps(guard.attempts) + "\n").encode())


async def _summary(store: MemoryStore) -> dict[str, Any]:
    rollouts = (await store.query_rollouts(limit=1000)).items
    spans = await store.query_spans([r.rollout_id for r in rollouts], latest_attempt_only=True)
    batch = LightningRL(credit="final", advantage="grpo", allow_empty=True).process(rollouts, spans)
    out: dict[str, Any] = {"rollouts": []}
    for rollout in rollouts:
        own = spans[rollout.rollout_id]
        gateway = [s for s in own if semconv.TOKEN_SOURCE in s.attributes]
        marked = [s for s in own if semconv.ADAPTER in s.attributes]
        llm = [s for s in marked if s.attributes.get(semconv.SPAN_KIND_ATTR) == semconv.KIND_LLM]
        response_ids = {s.attributes.get(semconv.GEN_AI_RESPONSE_ID) for s in gateway}
        parents = {s.parent_span_id for s in gateway}
        out["rollouts"].append(
            {
                "status": rollout.status.value,
                "reward": rollout.final_reward,
                "gateway_calls": len(gateway),
                "llm_spans": len(llm),
                "llm_spans_joined": sum(
                    1
                    for s in llm
                    if s.attributes.get(semconv.GEN_AI_RESPONSE_ID) in response_ids or s.span_id in parents
                ),
                "attempt_ok": all(s.attempt_id == rollout.current_attempt_id for s in marked),
                "kinds": sorted({str(s.attributes.get(semconv.SPAN_KIND_ATTR)) for s in marked}),
                "agents": sorted(
                    {
                        str(s.attributes.get(semconv.GEN_AI_AGENT_NAME))
                        for s in marked
                        if s.attributes.get(semconv.SPAN_KIND_ATTR) == semconv.KIND_AGENT
                    }
                ),
                "tools": sorted(
                    {
                        str(s.attributes.get(semconv.GEN_AI_TOOL_NAME))
                        for s in marked
                        if s.attributes.get(semconv.SPAN_KIND_ATTR) == semconv.KIND_TOOL
                    }
                ),
                "adapters": sorted({str(s.attributes[semconv.ADAPTER]) for s in marked}),
            }
        )
    out["transitions"] = [[tr.agent_name, tr.token_source.value] for tr in batch.transitions]
    return out


def run(script: str, *dirs: Any, timeout: float = 240) -> dict[str, Any]:
    """Run ``script`` (which calls :func:`main`) in a fresh interpreter, with ``dirs`` (the
    test's folder: its agents module) importable; its summary."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(here), *map(str, dirs), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout, env=env, cwd=here
    )
    assert out.returncode == 0, out.stderr[-4000:]
    lines = [line for line in out.stdout.splitlines() if line.startswith("SUMMARY ")]
    assert lines, out.stdout[-2000:] + out.stderr[-2000:]
    summary: dict[str, Any] = json.loads(lines[-1][len("SUMMARY ") :])
    at_exit = [line for line in out.stdout.splitlines() if line.startswith("OUTBOUND_AT_EXIT ")]
    assert at_exit, "the outbound guard's exit report is missing: " + out.stdout[-2000:]
    summary["outbound"] = json.loads(at_exit[-1][len("OUTBOUND_AT_EXIT ") :])  # the whole process's
    return summary
