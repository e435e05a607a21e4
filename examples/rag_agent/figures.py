"""The figures of a finished RAG training run, read back from the store.

The trainer's result gives held-out means; this reads the rollouts and spans of the run (the
latest run in the store) for what it does not hold: held-out answer F1 per task (so its
standard error), how often the model called ``search``, LLM calls and transitions per training
rollout and the share of calls recorded with exact token ids.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from typing import Any

from reward import f1_from_reward

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.algorithm import summarize
from agentbolt.store import Store, open_store


async def _all_rollouts(store: Store) -> list[t.Rollout]:
    rollouts: list[t.Rollout] = []
    cursor = None
    while True:
        page = await store.query_rollouts(limit=500, cursor=cursor)
        rollouts.extend(page.items)
        cursor = page.next_cursor
        if not cursor:
            return rollouts


def _run_and_tag(rollout: t.Rollout) -> tuple[str, str]:
    run, tag, *_ = (rollout.group_id or "::").split(":")
    return run, tag


def mean_and_stderr(values: Sequence[float]) -> tuple[float | None, float | None]:
    """Mean and its standard error (sample sd / sqrt(n))."""
    if not values:
        return None, None
    mean = statistics.fmean(values)
    return mean, (statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0)


def _called_search(spans: Sequence[t.Span]) -> bool:
    """Whether any LLM call of the rollout asked for ``search`` (from the gateway's recorded responses)."""
    for span in spans:
        body = span.attributes.get(semconv.LLM_RESPONSE)
        if not body:
            continue
        try:
            choices = json.loads(body).get("choices") or []
        except (TypeError, ValueError):
            continue
        for choice in choices:
            for call in (choice.get("message") or {}).get("tool_calls") or []:
                if (call.get("function") or {}).get("name") == "search":
                    return True
    return False


async def run_figures(store_url: str, steps: int) -> dict[str, Any]:
    """Held-out F1 before/after (with standard errors), tool-call rates and capture figures of the latest run."""
    store = open_store(store_url)
    try:
        rollouts = await _all_rollouts(store)
        if not rollouts:
            raise RuntimeError(f"no rollouts in {store_url}")
        run = _run_and_tag(rollouts[-1])[0]
        mine = [r for r in rollouts if _run_and_tag(r)[0] == run]
        by_tag: dict[str, list[t.Rollout]] = {}
        for r in mine:
            by_tag.setdefault(_run_and_tag(r)[1], []).append(r)
        out: dict[str, Any] = {}
        for when, tag in (("before", "val0"), ("after", f"val{steps}")):
            # rollouts that failed (e.g. timed out on a loaded machine) have no answer to score:
            # they are counted apart, not as F1 0, so a slow evaluation cannot fake a gain
            val = [r for r in by_tag.get(tag, []) if r.status is t.RolloutStatus.SUCCEEDED]
            out[f"n_val_failed_{when}"] = len(by_tag.get(tag, [])) - len(val)
            f1s = [f1_from_reward(r.final_reward or 0.0) for r in val]
            out[f"metric_{when}"], out[f"metric_stderr_{when}"] = mean_and_stderr(f1s)
            spans = await store.query_spans([r.rollout_id for r in val], latest_attempt_only=True) if val else {}
            calls = [_called_search(spans.get(r.rollout_id, [])) for r in val]
            out[f"tool_call_rate_{when}"] = sum(calls) / len(calls) if calls else None
            out[f"n_val_{when}"] = len(val)
        train = [r for tag, rs in by_tag.items() if tag.startswith("step") for r in rs]
        if train:
            summary = summarize(train, await store.query_spans([r.rollout_id for r in train], latest_attempt_only=True))
            out["exact_token_id_share"] = (
                summary.calls_with_exact_ids / summary.llm_calls if summary.llm_calls else None
            )
            out["train_llm_calls"] = summary.llm_calls
        else:
            out["exact_token_id_share"] = None
        return out
    finally:
        await store.close()


def main() -> None:
    """Print the figures of the latest run in a store: ``python figures.py STORE_URL STEPS``."""
    import asyncio
    import sys

    print(json.dumps(asyncio.run(run_figures(sys.argv[1], int(sys.argv[2]))), indent=2))


if __name__ == "__main__":
    main()
