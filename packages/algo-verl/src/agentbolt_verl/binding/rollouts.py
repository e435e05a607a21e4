"""One verl session → one agentbolt rollout → agent-loop outputs (verl-free).

verl's V1 trainer starts ``rollout.n`` sessions per dataset row and calls the agent loop's
``run()`` once per session. :class:`RolloutExecutor` turns such a call into:

1. an idempotent :meth:`Store.enqueue` of a rollout ``verl-{uid}-{session}`` (group ``uid``,
   so the rollouts of one prompt form one advantage group), picked up by agentbolt runners,
   which run the user's agent against the gateway;
2. :meth:`Store.wait_for_rollouts`, then :meth:`Store.query_spans` of its final attempt;
3. ``spans_to_transitions([rollout], spans)`` (LightningRL), the drop and truncation rules of
   :func:`agentbolt_verl.batch.prepare_rows`;
4. one output per kept transition with the fields of verl's ``AgentLoopOutput``.

Everything that is dropped, filled or truncated is counted and sent to a :class:`MetricsSink`
(the binding drains it into verl's step metrics).
"""

from __future__ import annotations

import inspect
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentbolt.errors import SchemaError, UserError
from agentbolt.lightningrl import LightningRL, LightningRLConfig
from agentbolt.store import Store
from agentbolt.types import Rollout, RolloutMode, RolloutSpec, RolloutStatus, Span, Task, Transition

from ..batch import BatchOptions, BatchStats, PreparedRow, prepare_rows
from ..config import AgentboltSettings, RolloutSettings

__all__ = [
    "LocalMetricsSink",
    "MetricsSink",
    "RolloutExecutor",
    "RolloutRequest",
    "RolloutResult",
    "SpansToTransitions",
    "batch_options",
    "decode_task_row",
    "executor_from_settings",
    "lightningrl_transitions",
    "task_row",
]

logger = logging.getLogger(__name__)

SpansToTransitions = Callable[[Sequence[Rollout], Mapping[str, Sequence[Span]]], Sequence[Transition]]
"""LightningRL's extraction: finished rollouts and their spans → transitions."""

TASK_KEY = "agentbolt"
"""Key under the dataset row's ``extra_info`` that holds the task (JSON)."""

METRICS_PREFIX = "agentbolt/rollouts/"


class MetricsSink(Protocol):
    """Where per-rollout counts go; the trainer drains them into its step metrics."""

    def add(self, counts: Mapping[str, float]) -> None:
        """Add counts (summed per key)."""
        ...

    def drain(self) -> dict[str, float]:
        """Return the sums since the last drain and reset them."""
        ...


class LocalMetricsSink:
    """A thread-safe in-process :class:`MetricsSink`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def add(self, counts: Mapping[str, float]) -> None:
        with self._lock:
            self._counts.update({k: float(v) for k, v in counts.items()})

    def drain(self) -> dict[str, float]:
        with self._lock:
            out, self._counts = dict(self._counts), Counter()
        return out


def task_row(task: Task, *, mode: RolloutMode = RolloutMode.TRAIN, index: int = 0) -> dict[str, Any]:
    """A dataset row for verl's ``RLHFDataset``: the task travels as JSON in ``extra_info``.

    ``prompt`` holds a minimal chat message (verl's dataset requires ``data.prompt_key``); the
    agent never sees it. ``agent_name`` selects the binding's agent loop.
    """
    payload = {"task_id": task.task_id, "input": task.input, "metadata": task.metadata, "mode": str(mode)}
    return {
        "data_source": "agentbolt",
        "agent_name": "agentbolt",
        "prompt": [{"role": "user", "content": f"agentbolt task {task.task_id}"}],
        "extra_info": {"index": index, TASK_KEY: json.dumps(payload)},
    }


def decode_task_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """The task payload of a dataset row written by :func:`task_row`."""
    extra = row.get("extra_info") or {}
    raw = extra.get(TASK_KEY) if isinstance(extra, Mapping) else None
    if raw is None:
        raise SchemaError(
            "the verl dataset row has no extra_info.agentbolt task: write the task files with "
            "agentbolt_verl.binding.entrypoint.write_task_files"
        )
    payload = json.loads(raw) if isinstance(raw, str) else dict(raw)
    if "task_id" not in payload:
        raise SchemaError(f"extra_info.agentbolt lacks task_id: {payload!r}")
    return payload


@dataclass(frozen=True)
class RolloutRequest:
    """One verl session to run as an agentbolt rollout."""

    uid: str
    """verl's prompt uid: the rollout's group."""
    session_id: int
    """verl's session index (0 to ``rollout.n - 1``)."""
    task_id: str | None
    """The task."""
    input: Any = None
    """The agent's input."""
    mode: RolloutMode = RolloutMode.TRAIN
    """``train`` or ``val``."""
    global_steps: int | None = None
    """verl's step that submitted the prompt (its weights are version ``global_steps - 1``)."""
    sampling: dict[str, Any] = field(default_factory=dict)
    """verl's sampling parameters for this session (recorded in the rollout's metadata)."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """The task's metadata."""

    @property
    def rollout_id(self) -> str:
        """Deterministic, so a re-issued session finds its rollout instead of running it again."""
        return f"verl-{self.uid}-{self.session_id}"

    @classmethod
    def from_verl_row(cls, row: Mapping[str, Any], sampling_params: Mapping[str, Any] | None = None) -> RolloutRequest:
        """From the keyword arguments verl passes to ``AgentLoopBase.run`` (the dataset row plus
        ``uid``, ``session_id`` and ``global_steps``)."""
        for key in ("uid", "session_id"):
            if key not in row:
                raise SchemaError(f"verl agent-loop call lacks {key!r} (is trainer.use_v1 true?)")
        payload = decode_task_row(row)
        steps = row.get("global_steps")
        return cls(
            uid=str(row["uid"]),
            session_id=int(row["session_id"]),
            task_id=str(payload["task_id"]),
            input=payload.get("input"),
            mode=RolloutMode(payload.get("mode", "train")),
            global_steps=None if steps is None else int(steps),
            sampling={k: _plain(v) for k, v in (sampling_params or {}).items()},
            metadata=dict(payload.get("metadata") or {}),
        )


@dataclass
class RolloutResult:
    """What :meth:`RolloutExecutor.run` produced for one session."""

    request: RolloutRequest
    rollout: Rollout
    """The rollout's final state (``cancelled`` if the wait timed out)."""
    outcome: str
    """``trained``, ``empty`` (nothing left after the rules), ``failed`` or ``timed_out``."""
    transitions: list[Transition] = field(default_factory=list)
    """Transitions LightningRL produced (after reward filling)."""
    rows: list[PreparedRow] = field(default_factory=list)
    """Rows kept by the batch rules."""
    outputs: list[dict[str, Any]] = field(default_factory=list)
    """One ``AgentLoopOutput`` field dict per row (without ``metrics``)."""
    stats: BatchStats = field(default_factory=BatchStats)
    """Batch-rule counts."""
    counts: dict[str, float] = field(default_factory=dict)
    """Everything counted for this rollout (sent to the metrics sink)."""
    duration_s: float = 0.0
    """Enqueue to outputs."""


class RolloutExecutor:
    """Runs verl sessions as agentbolt rollouts (see the module docstring).

    Args:
        store: the store the runners poll.
        spans_to_transitions: LightningRL's extraction.
        options: the batch rules (lengths, drops, log-probs).
        rollout: rollout settings (timeouts, attempts, failure policy).
        sink: receives the counts of every rollout.
    """

    def __init__(
        self,
        store: Store,
        spans_to_transitions: SpansToTransitions,
        options: BatchOptions,
        *,
        rollout: RolloutSettings | None = None,
        sink: MetricsSink | None = None,
    ) -> None:
        self.store = store
        self.spans_to_transitions = spans_to_transitions
        self.options = options
        self.settings = rollout or RolloutSettings()
        self.sink = sink
        self._weights_versions: dict[int, int | None] = {}

    @property
    def wait_timeout_s(self) -> float | None:
        """How long :meth:`run` waits for the rollout to finish."""
        s = self.settings
        if s.wait_timeout_s is not None:
            return s.wait_timeout_s
        return None if s.timeout_s is None else s.timeout_s * s.max_attempts + 60.0

    async def run(self, request: RolloutRequest) -> RolloutResult:
        """Enqueue, wait, extract, apply the batch rules; returns the outputs and the counts."""
        start = time.monotonic()
        rid = request.rollout_id
        spec = RolloutSpec(
            rollout_id=rid,
            task_id=request.task_id,
            input=request.input,
            mode=request.mode,
            group_id=request.uid,
            max_attempts=self.settings.max_attempts,
            timeout_s=self.settings.timeout_s,
            metadata={
                "task": request.metadata,
                "verl": {"uid": request.uid, "session_id": request.session_id, "global_steps": request.global_steps},
                "sampling": request.sampling,
            },
        )
        await self.store.enqueue([spec])
        [rollout] = await self.store.wait_for_rollouts([rid], timeout=self.wait_timeout_s)
        counts: Counter[str] = Counter(rollouts=1)
        outcome = "trained"
        if not rollout.status.is_final:
            [rollout] = await self.store.cancel([rid], reason=f"verl agent loop waited {self.wait_timeout_s}s")
            counts["timed_out"] += 1
            outcome = "timed_out"
        failed = rollout.status != RolloutStatus.SUCCEEDED
        if failed:
            counts["failed"] += 1
            outcome = "timed_out" if outcome == "timed_out" else "failed"
            if self.settings.on_failure == "drop":
                counts["dropped_failed"] += 1
                return self._finish(request, rollout, outcome, [], [], BatchStats(), counts, start)

        spans = await self.store.query_spans([rid], latest_attempt_only=True)
        transitions = sorted(self.spans_to_transitions([rollout], spans), key=lambda t: t.index)
        strangers = sorted({t.rollout_id for t in transitions} - {rid})
        if strangers:
            raise SchemaError(f"spans_to_transitions returned transitions of other rollouts {strangers} for {rid!r}")
        counts["calls"] += len(transitions)
        if failed:
            reward = self.settings.failure_reward
            transitions = [t.model_copy(update={"reward": reward}) for t in transitions]
            counts["failure_rewarded_calls"] += len(transitions)
        elif self.settings.fill_reward_from_rollout and rollout.final_reward is not None:
            filled = []
            for t in transitions:
                if t.reward is None:
                    t = t.model_copy(update={"reward": rollout.final_reward})
                    counts["rewards_from_rollout"] += 1
                filled.append(t)
            transitions = filled
        rows, stats = prepare_rows(transitions, self.options)
        if not rows:
            counts["empty"] += 1
            if outcome == "trained":
                outcome = "empty"
        outputs = await self._outputs(request, rollout, transitions, rows, counts)
        return self._finish(request, rollout, outcome, transitions, rows, stats, counts, start, outputs)

    async def _outputs(
        self,
        request: RolloutRequest,
        rollout: Rollout,
        transitions: list[Transition],
        rows: list[PreparedRow],
        counts: Counter[str],
    ) -> list[dict[str, Any]]:
        """verl's ``AgentLoopOutput`` fields for each row (one per LLM call)."""
        versions = [await self._weights_version(r.transition.policy_version if r.transition else None) for r in rows]
        fallback = max((request.global_steps or 1) - 1, 0)
        known = [v for v in versions if v is not None]
        low, high = (min(known), max(known)) if known else (fallback, fallback)
        if len(known) < len(versions):
            counts["weights_version_unknown_calls"] += len(versions) - len(known)
        outputs = []
        for row in rows:
            t = row.transition
            outputs.append(
                {
                    "prompt_ids": list(row.prompt_ids),
                    "response_ids": list(row.response_ids),
                    "response_mask": list(row.response_mask),
                    "response_logprobs": None if row.logprobs is None else list(row.logprobs),
                    "reward_score": float(row.reward),
                    "num_turns": 2 * len(transitions),
                    "extra_fields": {
                        # verl's V1 agent loop copies this from the last output (KeyError if absent)
                        "reward_extra_info": {},
                        # trajectory weight versions, read by verl's off-policy metrics
                        "min_global_steps": low,
                        "max_global_steps": high,
                        "agentbolt": {
                            "rollout_id": rollout.rollout_id,
                            "index": row.index,
                            "span_id": t.span_id if t is not None else None,
                            "policy_version": t.policy_version if t is not None else None,
                        },
                    },
                }
            )
        return outputs

    def _finish(
        self,
        request: RolloutRequest,
        rollout: Rollout,
        outcome: str,
        transitions: list[Transition],
        rows: list[PreparedRow],
        stats: BatchStats,
        counts: Counter[str],
        start: float,
        outputs: list[dict[str, Any]] | None = None,
    ) -> RolloutResult:
        all_counts = {f"{METRICS_PREFIX}{k}": float(v) for k, v in counts.items()}
        all_counts.update(stats.as_metrics(f"{METRICS_PREFIX}batch/"))
        all_counts = {k: v for k, v in all_counts.items() if v}
        if self.sink is not None:
            self.sink.add(all_counts)
        if stats.dropped or outcome in ("failed", "timed_out"):
            logger.warning(
                "rollout %s (task %s): %s, %d of %d calls kept",
                rollout.rollout_id,
                request.task_id,
                outcome,
                len(rows),
                stats.transitions_in,
            )
        return RolloutResult(
            request=request,
            rollout=rollout,
            outcome=outcome,
            transitions=transitions,
            rows=rows,
            outputs=outputs or [],
            stats=stats,
            counts=all_counts,
            duration_s=time.monotonic() - start,
        )

    async def _weights_version(self, policy_version: int | None) -> int | None:
        """verl's weight version (``global_steps`` at the update) behind a resources version."""
        if policy_version is None:
            return None
        if policy_version not in self._weights_versions:
            try:
                resources = await self.store.get_resources(policy_version)
            except KeyError:
                resources = None
            value = (resources.extra or {}).get("verl_weights_version") if resources is not None else None
            self._weights_versions[policy_version] = int(value) if isinstance(value, int | float) else None
        return self._weights_versions[policy_version]


def lightningrl_transitions(lightningrl: LightningRLConfig | None = None) -> SpansToTransitions:
    """The default ``spans_to_transitions``: agentbolt's LightningRL with the config's
    ``lightningrl`` section (empty batches allowed: verl skips them).

    Advantages computed by LightningRL are ignored: verl computes them across the group.
    """
    lrl = LightningRL(LightningRLConfig.from_value(lightningrl, allow_empty=True))

    def spans_to_transitions(rollouts: Sequence[Rollout], spans: Mapping[str, Sequence[Span]]) -> list[Transition]:
        return list(lrl.process(rollouts, spans).transitions)

    return spans_to_transitions


def batch_options(settings: AgentboltSettings, *, calculate_log_probs: bool) -> BatchOptions:
    """The batch rules of a composed config (lengths resolved by ``compose_verl_config``).

    Sampling log-probs are required when verl reads them (``rollout.calculate_log_probs``):
    verl fetches ``rollout_log_probs`` for every row then.
    """
    b = settings.batch
    if b.max_prompt_length is None or b.max_response_length is None:
        raise UserError("agentbolt.batch lengths are unresolved: compose the config with compose_verl_config")
    return BatchOptions(
        max_prompt_length=b.max_prompt_length,
        max_response_length=b.max_response_length,
        overlong_prompt=b.overlong_prompt,
        overlong_response=b.overlong_response,
        missing_reward=b.missing_reward,
        retokenized=b.retokenized,
        logprobs="require" if calculate_log_probs else "ignore",
    )


def executor_from_settings(
    settings: AgentboltSettings,
    *,
    calculate_log_probs: bool,
    sink: MetricsSink | None = None,
    open_store: Callable[[str], Store] | None = None,
) -> RolloutExecutor:
    """A :class:`RolloutExecutor` for the binding's settings (opens the store, loads LightningRL)."""
    from .gateway import load_object

    if open_store is None:
        from agentbolt.store import open_store as _open

        open_store = _open
    factory = load_object(settings.transitions)
    options = {"lightningrl": settings.lightningrl, **settings.transitions_options}
    try:
        inspect.signature(factory).bind(**options)
    except TypeError as exc:
        raise UserError(
            f"transitions factory {settings.transitions!r} does not take lightningrl= plus transitions_options "
            f"{sorted(settings.transitions_options)}: {exc} (LightningRL's choices go in agentbolt.lightningrl)"
        ) from None
    spans_to_transitions = factory(**options)
    if not callable(spans_to_transitions):
        raise UserError(f"{settings.transitions!r} returned {type(spans_to_transitions).__name__}, not a callable")
    return RolloutExecutor(
        open_store(settings.store_url),
        spans_to_transitions,
        batch_options(settings, calculate_log_probs=calculate_log_probs),
        rollout=settings.rollout,
        sink=sink,
    )


def _plain(value: Any) -> Any:
    """numpy scalars (verl's non-tensor rows) → Python values, for JSON metadata."""
    item = getattr(value, "item", None)
    if callable(item) and not isinstance(value, str | bytes):
        try:
            return item()
        except (TypeError, ValueError):
            return value
    return value
