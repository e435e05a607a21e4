"""The deployed agent: a plain OpenAI client, instrumented with OpenInference, exporting OTLP.

Nothing here imports agentbolt. It is the quickstart's arithmetic agent as a team would run it
in production: its model is served by a plain OpenAI-compatible server (here agentbolt-torch's
policy server started by ``improve.py``; in production a hosted API or your own vLLM), every
call is traced by OpenInference's OpenAI instrumentation, and the traces go to an OTLP endpoint
with the standard OTLP/HTTP exporter -- the collector URL of your deployment, here
``agentbolt ingest``'s. One question is one trace (the ``math-agent`` agent span and its LLM
span).

    python deployed_agent.py --base-url http://127.0.0.1:8000/v1 --model smollm2 \
        --otlp http://127.0.0.1:4318/v1/traces --questions questions.jsonl [--concurrency 8]

``questions.jsonl``: one ``{"question": ...}`` per line. Prints one JSON line at the end: how many
questions were answered and the trace ids.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "quickstart"))

from math_tasks import few_shot  # the quickstart's prompt: the same agent

MAX_TOKENS = 40
"""Reply length the deployment allows."""


def build_tracing(otlp_endpoint: str, service: str = "math-agent") -> Any:
    """A tracer provider exporting to ``otlp_endpoint`` (OTLP/HTTP), with OpenInference's OpenAI
    instrumentation on: what the OpenInference docs set up for Phoenix or any collector."""
    from openinference.instrumentation import TracerProvider
    from openinference.instrumentation.openai import OpenAIInstrumentor
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=otlp_endpoint)))
    OpenAIInstrumentor().instrument(tracer_provider=provider)
    return provider


def answer(client: Any, model: str, question: str, temperature: float = 1.0) -> str:
    """The agent: the quickstart's few-shot prompt, one model call, the reply's text."""
    reply = client.chat.completions.create(
        model=model,
        messages=[*few_shot(False), {"role": "user", "content": question}],
        temperature=temperature,
        max_tokens=MAX_TOKENS,
    )
    return reply.choices[0].message.content or ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", required=True, help="The model server (any OpenAI-compatible URL).")
    parser.add_argument("--model", required=True)
    parser.add_argument("--otlp", required=True, help="OTLP/HTTP traces endpoint, e.g. http://127.0.0.1:4318/v1/traces")
    parser.add_argument("--questions", type=Path, required=True)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--temperature", type=float, default=1.0)
    args = parser.parse_args()

    import openai

    provider = build_tracing(args.otlp)
    tracer = provider.get_tracer("math-agent")
    client = openai.OpenAI(base_url=args.base_url, api_key="none", max_retries=2, timeout=600)
    questions = [json.loads(line)["question"] for line in args.questions.read_text().splitlines() if line.strip()]
    trace_ids: list[str] = []

    @tracer.agent(name="math-agent")
    def agent(question: str) -> str:
        from opentelemetry import trace

        trace_ids.append(format(trace.get_current_span().get_span_context().trace_id, "032x"))
        return answer(client, args.model, question, args.temperature)

    with ThreadPoolExecutor(args.concurrency) as pool:
        replies = list(pool.map(agent, questions))
    provider.force_flush()
    provider.shutdown()
    print(json.dumps({"answered": len(replies), "traces": trace_ids}))


if __name__ == "__main__":
    main()
