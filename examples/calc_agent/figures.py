"""The run's figures read back from the store: held-out metric with its standard error, tool use, token ids.

After ``Trainer.fit`` every rollout and span of the run is in the store. Rollout ids are
``{run}:{tag}:{task_id}:{k}`` (tags ``val0``/``val{steps}`` for the held-out passes before and
after training, ``step{n}`` for training), so one run's rollouts are found by their prefix.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.store import open_store

TOOL = "calculator"


@dataclass
class PassFigures:
    """One held-out pass: accuracy, its standard error and how often the calculator was called."""

    n: int
    accuracy: float
    stderr: float
    tool_call_rate: float


def mean_stderr(values: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error (sample sd / sqrt(n)) of ``values``."""
    if not values:
        return math.nan, math.nan
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return mean, sd / math.sqrt(len(values))


def _messages(value: Any) -> list[Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return []
    return value if isinstance(value, list) else []


def calls_tool(spans: Sequence[t.Span], tool: str = TOOL) -> bool:
    """Whether a rollout called ``tool``: an adapter ``execute_tool`` span, or ``tool_calls`` in an LLM call's output."""
    for span in spans:
        attrs = span.attributes
        if (
            attrs.get(semconv.GEN_AI_OPERATION_NAME) == semconv.OP_EXECUTE_TOOL
            and attrs.get(semconv.GEN_AI_TOOL_NAME) == tool
        ):
            return True
        if semconv.TOKEN_SOURCE in attrs:  # the gateway's LLM-call span
            for message in _messages(attrs.get(semconv.GEN_AI_OUTPUT_MESSAGES)):
                calls = message.get("tool_calls") if isinstance(message, Mapping) else None
                if any((c.get("function") or {}).get("name") == tool for c in calls or ()):
                    return True
    return False


def pass_figures(rollouts: Sequence[t.Rollout], spans: Mapping[str, Sequence[t.Span]], threshold: float) -> PassFigures:
    correct = [float(r.final_reward is not None and r.final_reward >= threshold) for r in rollouts]
    accuracy, stderr = mean_stderr(correct)
    tools = [calls_tool(spans.get(r.rollout_id, ())) for r in rollouts]
    return PassFigures(len(rollouts), accuracy, stderr, sum(tools) / len(tools) if tools else math.nan)


async def _all_rollouts(store: Any, mode: t.RolloutMode) -> list[t.Rollout]:
    out: list[t.Rollout] = []
    cursor = None
    while True:
        page = await store.query_rollouts(mode=mode, limit=500, cursor=cursor)
        out += page.items
        cursor = page.next_cursor
        if not cursor:
            return out


async def _spans(store: Any, rollouts: Sequence[t.Rollout]) -> dict[str, list[t.Span]]:
    spans: dict[str, list[t.Span]] = {}
    ids = [r.rollout_id for r in rollouts]
    for i in range(0, len(ids), 200):
        spans.update(await store.query_spans(ids[i : i + 200], latest_attempt_only=True))
    return spans


async def run_figures(store_url: str, *, steps: int, threshold: float = 1.0) -> dict[str, Any]:
    """Held-out accuracy, standard error and tool-call rate before/after, and the exact-id share, of the newest run."""
    store = open_store(store_url)
    try:
        val = await _all_rollouts(store, t.RolloutMode.VAL)
        if not val:
            raise RuntimeError(f"{store_url}: no held-out rollouts (was the run given --val > 0?)")
        run = val[-1].rollout_id.split(":", 1)[0]
        passes: dict[str, Any] = {}
        for when, tag in (("before", "val0"), ("after", f"val{steps}")):
            rollouts = [r for r in val if r.group_id.startswith(f"{run}:{tag}:")]
            passes[when] = pass_figures(rollouts, await _spans(store, rollouts), threshold)
        train = [r for r in await _all_rollouts(store, t.RolloutMode.TRAIN) if r.rollout_id.startswith(f"{run}:")]
        sources: dict[str, int] = {}
        for span_list in (await _spans(store, train)).values():
            for span in span_list:
                if semconv.TOKEN_SOURCE in span.attributes:
                    key = str(span.attributes[semconv.TOKEN_SOURCE])
                    sources[key] = sources.get(key, 0) + 1
        calls = sum(sources.values())
    finally:
        await store.close()
    return {
        "run_id": run,
        "n_val": passes["before"].n,
        "metric_before": passes["before"].accuracy,
        "metric_after": passes["after"].accuracy,
        "metric_stderr_before": passes["before"].stderr,
        "metric_stderr_after": passes["after"].stderr,
        "tool_call_rate_before": passes["before"].tool_call_rate,
        "tool_call_rate_after": passes["after"].tool_call_rate,
        "exact_token_id_share": sources.get(semconv.TOKEN_SOURCE_EXACT, 0) / calls if calls else None,
        "train_llm_calls": calls,
    }
