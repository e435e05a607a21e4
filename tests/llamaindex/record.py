"""Write the run record of the LlamaIndex reconciliation case (the numbers the test asserts).

    /tmp/llama/bin/python tests/llamaindex/record.py docs/runs/reconciliation_llamaindex.json

(in the environment of ``test_llamaindex_reconciliation.py``'s docstring). For each mode
(``achat``, ``astream_chat``): backend requests, gateway calls, LightningRL calls, unjoined
framework LLM spans, flagged rollouts, joins by kind, agent names, and whether every credit mode's
transition rewards equal the hand-computed reference.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import pytest
import test_llamaindex_reconciliation as case

from agentbolt import semconv
from agentbolt.lightningrl import LightningRL


def mode_record(streaming: bool) -> dict[str, Any]:
    rollouts, spans, fake = case.run(streaming)
    batch = LightningRL(credit="final", advantage="grpo").process(rollouts, spans)
    rewards = {r.rollout_id: float(r.final_reward or 0.0) for r in rollouts}
    calls = {q: n for q, _, n in case.TASKS}
    credit_ok = {}
    for mode in ("final", "discounted", "intermediate", "air"):
        options = {"gamma": case.GAMMA} if mode == "discounted" else {}
        got = LightningRL(credit=mode, credit_options=options, advantage="grpo").collect(rollouts, spans)
        credit_ok[mode] = all(
            [t.reward for t in sorted(got.transitions, key=lambda x: x.index) if t.rollout_id == r.rollout_id]
            == pytest.approx(case.hand_credit(mode, rewards[r.rollout_id], calls[r.input["question"]]))
            for r in rollouts
        )
    gateway = sum(1 for ss in spans.values() for s in ss if semconv.TOKEN_SOURCE in s.attributes)
    return {
        "backend_requests": len(fake.requests),
        "gateway_calls": gateway,
        "hand_count": case.CALLS,
        "reconciliation": batch.report.reconciliation,
        "joins": {k: v for k, v in batch.report.extraction.items() if k.startswith("joined_by")},
        "trained_calls": batch.report.trained_calls,
        "agent_names": sorted({str(t.agent_name) for t in batch.transitions}),
        "rewards": sorted(rewards.values()),
        "credit_equals_hand_count": credit_ok,
    }


def main(out: str) -> None:
    versions = {
        d: importlib.metadata.version(d)
        for d in ("llama-index-core", "llama-index-llms-openai", "openinference-instrumentation-llama-index", "openai")
    }
    record = {
        "what": "issue 37's LlamaIndex case: FunctionAgent, two tools, OpenInference, Trainer.dev on the fake backend",
        "command": f"python tests/llamaindex/record.py {out}",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "versions": versions,
        "modes": {"achat": mode_record(False), "astream_chat": mode_record(True)},
    }
    Path(out).write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main(sys.argv[1])
