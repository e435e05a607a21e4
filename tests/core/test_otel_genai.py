"""An agent instrumented only with plain OpenTelemetry GenAI spans (no adapter) still trains."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import asyncio, json
    import openai
    from opentelemetry import trace
    from agentbolt.lightningrl import LightningRL
    from agentbolt.store.memory import MemoryStore
    from agentbolt.testing.fake_llm import FakeLLM, FakeLLMServer
    from agentbolt.trainer import Trainer

    tracer = trace.get_tracer("my.agent")

    async def agent(task, resources):
        client = openai.AsyncOpenAI(base_url=resources.llm.base_url, api_key="x", max_retries=0)
        for name in ("planner", "solver"):
            # OpenTelemetry GenAI semantic conventions, written by hand (or by any GenAI instrumentation).
            with tracer.start_as_current_span(f"invoke_agent {name}") as agent_span:
                agent_span.set_attribute("gen_ai.operation.name", "invoke_agent")
                agent_span.set_attribute("gen_ai.agent.name", name)
                with tracer.start_as_current_span("chat fake-model") as llm_span:
                    llm_span.set_attribute("gen_ai.operation.name", "chat")
                    reply = await client.chat.completions.create(
                        model=resources.llm.model, messages=[{"role": "user", "content": f"{name}: {task['q']}"}]
                    )
                    llm_span.set_attribute("gen_ai.response.id", reply.id)
        return 1.0

    store = MemoryStore()
    with FakeLLMServer(FakeLLM()) as server:
        result = Trainer(agent, store=store, runners={"n": 0}, capture={"adapters": []}, progress=False).dev(
            [{"q": f"q{i}"} for i in range(4)], llm=server.base_url
        )

    async def transitions():
        page = await store.query_rollouts()
        spans = await store.query_spans([r.rollout_id for r in page.items], latest_attempt_only=True)
        batch = LightningRL(agent_match="solver").process(page.items, spans)
        return batch

    batch = asyncio.run(transitions())
    print(json.dumps({
        "capture_ok": result.capture_ok(),
        "calls": result.llm_calls,
        "agents": sorted({t.agent_name for t in batch.transitions}),
        "n": len(batch.transitions),
        "excluded": batch.report.excluded,
        "sources": sorted({t.token_source.value for t in batch.transitions}),
    }))
    """
)


def test_plain_opentelemetry_genai_spans_give_agent_names() -> None:
    # A fresh interpreter: the OpenTelemetry tracer provider is process-wide.
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["capture_ok"] and result["calls"] == 8
    assert result["agents"] == ["solver"] and result["n"] == 4  # agent_match selected solver's calls
    assert result["excluded"] == {"agent_not_selected": 4}  # the planner's calls, named and left out
    assert result["sources"] == ["exact"]
