"""The run's figures read back from the store: per held-out tier, accuracy ± standard error and tool use.

After ``Trainer.fit`` every rollout and span of the run is in the store. Rollout ids are
``{run}:{tag}:{task_id}:{k}`` (tags ``val0``/``val{steps}`` for the held-out passes before and
after training, ``step{n}``/``sft{n}`` for training), so one pass of one run is found by its
prefix, and each held-out rollout's tier by its task id.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.store import open_store

TOOL = "calculator"


@dataclass
class PassFigures:
    """One held-out pass on one tier: accuracy, its standard error and how often the calculator was called."""

    n: int
    accuracy: float
    se: float
    """Standard error of the accuracy, sqrt(p(1-p)/n)."""
    tool_call_rate: float
    """Share of the held-out rollouts with at least one calculator call."""
    calls_per_rollout: float
    """LLM calls per held-out rollout."""

    def as_stage(self) -> dict[str, float]:
        """The ``stages`` entry of a run record: ``score`` (accuracy), ``se``, ``tool_call_rate``."""
        return {"score": self.accuracy, "se": self.se, "tool_call_rate": self.tool_call_rate}


def accuracy_se(p: float, n: int) -> float:
    """Standard error of a share ``p`` of ``n`` 0/1 outcomes."""
    return math.sqrt(p * (1 - p) / n) if n else math.nan


def _messages(value: Any) -> list[Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return []
    return value if isinstance(value, list) else []


def _is_call(span: t.Span) -> bool:
    return semconv.TOKEN_SOURCE in span.attributes  # the gateway's LLM-call span


def calls_tool(spans: Sequence[t.Span], tool: str = TOOL) -> bool:
    """Whether a rollout called ``tool``: an adapter ``execute_tool`` span, or ``tool_calls`` in an LLM call's output."""
    for span in spans:
        attrs = span.attributes
        if (
            attrs.get(semconv.GEN_AI_OPERATION_NAME) == semconv.OP_EXECUTE_TOOL
            and attrs.get(semconv.GEN_AI_TOOL_NAME) == tool
        ):
            return True
        if _is_call(span):
            for message in _messages(attrs.get(semconv.GEN_AI_OUTPUT_MESSAGES)):
                calls = message.get("tool_calls") if isinstance(message, Mapping) else None
                if any((c.get("function") or {}).get("name") == tool for c in calls or ()):
                    return True
    return False


def pass_figures(rollouts: Sequence[t.Rollout], spans: Mapping[str, Sequence[t.Span]], threshold: float) -> PassFigures:
    n = len(rollouts)
    correct = sum(r.final_reward is not None and r.final_reward >= threshold for r in rollouts)
    accuracy = correct / n if n else math.nan
    tools = sum(calls_tool(spans.get(r.rollout_id, ())) for r in rollouts)
    calls = sum(_is_call(s) for r in rollouts for s in spans.get(r.rollout_id, ()))
    return PassFigures(
        n, accuracy, accuracy_se(accuracy, n), tools / n if n else math.nan, calls / n if n else math.nan
    )


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


async def latest_run(store_url: str) -> str:
    """The run id of the newest held-out rollout in the store (the run that just finished)."""
    store = open_store(store_url)
    try:
        val = await _all_rollouts(store, t.RolloutMode.VAL)
    finally:
        await store.close()
    if not val:
        raise RuntimeError(f"{store_url}: no held-out rollouts (was the run given held-out tasks?)")
    return val[-1].rollout_id.split(":", 1)[0]


async def heldout_pass(
    store_url: str, run: str, tag: str, tier_of: Mapping[str, str], *, threshold: float = 1.0
) -> dict[str, PassFigures]:
    """Figures of one held-out pass (``tag``: ``val0``, ``val{steps}``) of ``run``, per tier."""
    store = open_store(store_url)
    try:
        rollouts = [r for r in await _all_rollouts(store, t.RolloutMode.VAL) if r.group_id.startswith(f"{run}:{tag}:")]
        spans = await _spans(store, rollouts)
    finally:
        await store.close()
    by_tier: dict[str, list[t.Rollout]] = {}
    for r in rollouts:
        by_tier.setdefault(tier_of.get(r.task_id or "", "?"), []).append(r)
    return {tier: pass_figures(rs, spans, threshold) for tier, rs in sorted(by_tier.items())}


async def training_calls(store_url: str, run: str) -> dict[str, Any]:
    """The training rollouts of ``run``: LLM calls per rollout, tool-call rate and token-id sources."""
    store = open_store(store_url)
    try:
        train = [r for r in await _all_rollouts(store, t.RolloutMode.TRAIN) if r.rollout_id.startswith(f"{run}:")]
        spans = await _spans(store, train)
    finally:
        await store.close()
    sources: dict[str, int] = {}
    for span_list in spans.values():
        for span in span_list:
            if _is_call(span):
                key = str(span.attributes[semconv.TOKEN_SOURCE])
                sources[key] = sources.get(key, 0) + 1
    calls = sum(sources.values())
    return {
        "train_rollouts": len(train),
        "train_llm_calls": calls,
        "train_calls_per_rollout": calls / len(train) if train else None,
        "train_tool_call_rate": sum(calls_tool(spans.get(r.rollout_id, ())) for r in train) / len(train)
        if train
        else None,
        "exact_token_id_share": sources.get(semconv.TOKEN_SOURCE_EXACT, 0) / calls if calls else None,
    }
