"""Run the RAG example's agent through the gateway against the fake LLM; print what was captured as JSON.

Run in a subprocess by ``test_rag_agent_example.py`` (the examples' modules are named alike and
must not share a process). The fake model behaves like a perfect student of the few-shot
prompt: it calls ``search`` with the question, then answers with the birth city or the
university named in the returned paragraph that mentions the question's work -- so a reward of
1.0 needs the real FTS5 index to have returned that paragraph.

    python tests/examples/rag_agent_fake_llm.py CACHE_DIR N_TASKS
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "examples/rag_agent"))

from agent import rag_agent  # noqa: E402
from agents.tracing import set_trace_processors  # noqa: E402
from train import prepare  # noqa: E402

from agentbolt import semconv  # noqa: E402
from agentbolt.lightningrl import LightningRL  # noqa: E402
from agentbolt.options import CaptureOptions, RunnerOptions  # noqa: E402
from agentbolt.store.memory import MemoryStore  # noqa: E402
from agentbolt.testing.fake_llm import FakeLLM, FakeLLMServer, FakeRequest, Rule, ToolCall, ToolCalls  # noqa: E402
from agentbolt.trainer import Trainer  # noqa: E402

_WORK = re.compile(r"of (.+?) (?:born|attend)\?$")


def _question(req: FakeRequest) -> str:
    return str(req.messages[-1]["content"]) if req.messages else ""


def _answer(req: FakeRequest) -> str:
    user = [m for m in req.messages or [] if m.get("role") == "user"][-1]["content"]
    work = _WORK.search(str(user))
    found = str((req.messages or [])[-1].get("content"))
    for line in found.splitlines():
        if work and f"of {work.group(1)}." in line:
            pattern = r"born in (.+?) and" if "born" in str(user) else r"studied at (.+?)\.$"
            hit = re.search(pattern, line)
            if hit:
                return f"<answer>{hit.group(1)}</answer>"
    return "<answer>unknown</answer>"


def backend() -> FakeLLM:
    return FakeLLM(
        rules=[
            Rule(
                match=lambda r: bool(r.messages) and r.messages[-1].get("role") == "user",
                reply=lambda r: ToolCalls([ToolCall("search", {"query": _question(r)})]),
            ),
            Rule(match=lambda r: bool(r.messages) and r.messages[-1].get("role") == "tool", reply=_answer),
        ],
        default_reply="I do not know.",
    )


async def collect(store: MemoryStore) -> dict:
    rollouts = (await store.query_rollouts(limit=10_000)).items
    spans = await store.query_spans([r.rollout_id for r in rollouts], latest_attempt_only=True)
    batch = LightningRL(credit="final", advantage="grpo", allow_empty=True).process(rollouts, spans)
    tools = [
        s.attributes.get(semconv.GEN_AI_TOOL_NAME)
        for ss in spans.values()
        for s in ss
        if s.attributes.get(semconv.SPAN_KIND_ATTR) == semconv.KIND_TOOL
    ]
    dimensions = [
        json.loads(s.attributes[semconv.REWARD_DIMENSIONS])
        for ss in spans.values()
        for s in ss
        if s.name == semconv.SPAN_REWARD and s.attributes.get(semconv.REWARD_IS_FINAL)
    ]
    return {
        "rewards": [r.final_reward for r in rollouts],
        "dimensions": dimensions,
        "gateway_calls": sum(1 for ss in spans.values() for s in ss if semconv.TOKEN_SOURCE in s.attributes),
        "transitions": [
            {"agent": tr.agent_name, "source": tr.token_source.value, "response_ids": len(tr.response_ids)}
            for tr in batch.transitions
        ],
        "excluded": batch.report.excluded,
        "tools": tools,
        "apis": sorted(
            {
                str(s.attributes.get("agentbolt.llm.api"))
                for ss in spans.values()
                for s in ss
                if semconv.TOKEN_SOURCE in s.attributes
            }
        ),
    }


def main() -> None:
    cache_dir, n = Path(sys.argv[1]), int(sys.argv[2])
    set_trace_processors([])  # no export to OpenAI; the adapter adds its own processor
    _, val, _ = prepare(None, cache_dir, n)
    store = MemoryStore()
    with FakeLLMServer(backend()) as server:
        trainer = Trainer(
            rag_agent,
            store=store,
            runners=RunnerOptions(n=0),
            capture=CaptureOptions(adapters=["openai-agents"]),
            progress=False,
        )
        result = trainer.dev(val, llm=server.base_url, model="fake-model")
    assert result.failed == 0, result.failures
    print(json.dumps(asyncio.run(collect(store))))


if __name__ == "__main__":
    main()
