"""How often retokenization rebuilds the wrong ids, and how often the drift check notices.

Run:  uv run python benchmarks/retokenize_drift.py [--model smollm2] [--per-kind 10]

The policy server of ``agentbolt-torch`` (SmolLM2-135M-Instruct by default) answers chat calls
with its exact token ids. For each call the benchmark also rebuilds the ids from the text alone
with :class:`agentbolt.capture.retokenize.ChatTemplateRetokenizer` and the policy's own tokenizer (what
``CaptureOptions(token_ids="retokenize")`` does for a backend that returns no ids), then compares:

- ``wrong``: rebuilt prompt or response ids differ from the exact ids;
- ``flagged``: the drift check (usage token counts, text round trip) flags the call;
- ``missed``: wrong but not flagged (a silent error: trained on wrong tokens);
- ``false alarms``: flagged although the ids are right.

Three kinds of calls: one turn (system + user), two turns (the first reply sent back plus a
follow-up), and calls offering a function tool.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from agentbolt.capture.retokenize import ChatTemplateRetokenizer, drift_reasons

QUESTIONS = [
    "What is 3 + 5?",
    "Name a primary color.",
    "What is the capital of France?",
    "Spell the word cat backwards.",
    "What is 12 divided by 4?",
    "Is water wet? Answer in one word.",
    "Give me a synonym for happy.",
    "What comes after Monday?",
    "How many legs does a spider have?",
    "What is 7 times 6?",
    "Name a fruit that is yellow.",
    "What is the opposite of hot?",
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
CITIES = ["Paris", "Tokyo", "Lima", "Rome", "Oslo", "Cairo", "Delhi", "Quito", "Seoul", "Berlin", "Madrid", "Nairobi"]


def call(client: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    r = client.post("/chat/completions", json={**body, "return_token_ids": True, "max_tokens": 32, "seed": 1})
    r.raise_for_status()
    return r.json()


def conversations(client: httpx.Client, model: str, per_kind: int) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(kind, request, response) for each call; independent calls run at once (the engine batches them)."""
    system = {"role": "system", "content": "You are a helpful assistant. Answer briefly."}
    with ThreadPoolExecutor(max_workers=3 * per_kind) as pool:

        def run(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return list(pool.map(lambda body: call(client, body), requests))

        one = [{"model": model, "messages": [system, {"role": "user", "content": q}]} for q in QUESTIONS[:per_kind]]
        tools = [
            {"model": model, "messages": [{"role": "user", "content": f"What is the weather in {c}?"}], "tools": TOOLS}
            for c in CITIES[:per_kind]
        ]
        first = run(one + tools)
        two = []
        for req, resp in zip(one, first, strict=False):
            reply = resp["choices"][0]["message"].get("content") or ""
            messages = [*req["messages"], {"role": "assistant", "content": reply}]
            two.append(
                {"model": model, "messages": [*messages, {"role": "user", "content": "Explain in one sentence."}]}
            )
        second = run(two)
    return (
        [("one turn", r, a) for r, a in zip(one, first[:per_kind], strict=True)]
        + [("two turns", r, a) for r, a in zip(two, second, strict=True)]
        + [("tools", r, a) for r, a in zip(tools, first[per_kind:], strict=True)]
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2", help="smollm2, tiny or a local Hugging Face directory")
    ap.add_argument("--per-kind", type=int, default=10)
    args = ap.parse_args()
    from agentbolt_torch.generation.engine import GenerationEngine
    from agentbolt_torch.policy import Policy
    from agentbolt_torch.serving.server import PolicyServer

    policy = Policy.load(args.model)
    retokenize = ChatTemplateRetokenizer(policy.tokenizer)
    started = time.perf_counter()
    with (
        GenerationEngine(policy, default_max_tokens=32) as engine,
        PolicyServer(engine) as server,
        httpx.Client(base_url=server.base_url, timeout=600) as client,
    ):
        calls = conversations(client, policy.name, args.per_kind)
    print(f"retokenization drift: {len(calls)} calls to {args.model} ({time.perf_counter() - started:.0f} s)")
    print(f"{'calls':>10} | {'n':>3} {'wrong':>6} {'flagged':>8} {'missed':>7} {'false alarms':>13}")
    rows: dict[str, list[int]] = {}
    example: dict[str, str] = {}
    for kind, request, response in calls:
        exact = (response["prompt_token_ids"], response["choices"][0]["token_ids"])
        text_only = copy.deepcopy(response)
        text_only.pop("prompt_token_ids")
        for choice in text_only["choices"]:
            choice.pop("token_ids", None)
        rebuilt = retokenize(request, text_only)
        assert rebuilt is not None
        wrong = (list(rebuilt[0]), list(rebuilt[1])) != (list(exact[0]), list(exact[1]))
        reasons = drift_reasons(text_only, rebuilt[0], rebuilt[1], retokenize.decode)
        row = rows.setdefault(kind, [0, 0, 0, 0, 0])
        row[0] += 1
        row[1] += wrong
        row[2] += bool(reasons)
        row[3] += wrong and not reasons
        row[4] += bool(reasons) and not wrong
        if reasons and kind not in example:
            example[kind] = reasons[0]
    total = [sum(col) for col in zip(*rows.values(), strict=True)]
    for kind, (n, wrong, flagged, missed, false_alarms) in [*rows.items(), ("all", total)]:
        print(f"{kind:>10} | {n:>3} {wrong:>6} {flagged:>8} {missed:>7} {false_alarms:>13}")
    for kind, reason in example.items():
        print(f"example drift ({kind}): {reason}")
    print(json.dumps({"model": args.model, "rows": rows}))


if __name__ == "__main__":
    main()
