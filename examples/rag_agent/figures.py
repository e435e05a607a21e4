"""The figures of a finished RAG training run, read back from the store.

The trainer's result gives held-out means; this reads the held-out rollouts of the run (the
latest run in the store) for what it does not hold: exact match and answer F1 per task (the
reward dimensions the agent emits, so their standard errors), how often the model called
``search``, and the share of training calls recorded with exact token ids.
"""

from __future__ import annotations

import json
from typing import Any

from agentbolt import types as t
from agentbolt.algorithm import summarize
from agentbolt.runs.evaluation import latest_run, mean_and_se, read_heldout
from agentbolt.store import open_store


async def _exact_id_share(store_url: str, run_id: str | None) -> float | None:
    """Share of the run's training LLM calls recorded with the policy's exact token ids."""
    store = open_store(store_url)
    try:
        train, cursor = [], None
        while True:
            page = await store.query_rollouts(mode=t.RolloutMode.TRAIN, limit=1000, cursor=cursor)
            train += [r for r in page.items if r.run_id == run_id]
            cursor = page.next_cursor
            if not cursor:
                break
        spans: dict[str, list[t.Span]] = {}
        ids = [r.rollout_id for r in train]
        for i in range(0, len(ids), 200):
            spans.update(await store.query_spans(ids[i : i + 200], latest_attempt_only=True))
    finally:
        await store.close()
    summary = summarize(train, spans)
    return summary.calls_with_exact_ids / summary.llm_calls if summary.llm_calls else None


async def run_figures(store_url: str, steps: int) -> dict[str, Any]:
    """Per held-out stage (``before``, ``after``): exact match (``score``) and F1 with standard
    errors, the share of questions that called ``search``, failed rollouts; and the exact-id share."""
    run_id = await latest_run(store_url)
    tags = {"before": "val0", "after": f"val{steps}" if steps else "val0"}
    outcomes = await read_heldout(store_url, sorted(set(tags.values())), run_id=run_id)
    stages: dict[str, dict[str, float]] = {}
    for stage, tag in tags.items():
        results = outcomes[tag]
        em, em_se = mean_and_se([o.score("exact_match") for o in results])
        f1, f1_se = mean_and_se([o.score("f1") for o in results])
        stages[stage] = {
            "score": em,
            "se": em_se,
            "f1": f1,
            "f1_se": f1_se,
            "tool_call_rate": sum("search" in o.tool_calls for o in results) / len(results),
            "failed": float(sum(not o.succeeded for o in results)),
        }
    return {
        "n": len(outcomes[tags["before"]]),
        "stages": stages,
        "exact_token_id_share": await _exact_id_share(store_url, run_id),
    }


def main() -> None:
    """Print the figures of the latest run in a store: ``python figures.py STORE_URL STEPS``."""
    import asyncio
    import sys

    print(json.dumps(asyncio.run(run_figures(sys.argv[1], int(sys.argv[2]))), indent=2))


if __name__ == "__main__":
    main()
