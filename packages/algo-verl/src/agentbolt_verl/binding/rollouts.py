"""One verl session → one agentbolt rollout → agent-loop outputs (verl-free).

verl's V1 trainer starts ``rollout.n`` sessions per dataset row and calls the agent loop's
``run()`` once per session. :class:`RolloutExecutor` turns such a call into:

1. an idempotent :meth:`Store.enqueue` of a rollout ``verl-{uid}-{session}`` (group ``uid``,
   so the rollouts of one prompt form one advantage group), picked up by agentbolt runners,
   which run the user's agent against the gateway;
2. :meth:`Store.wait_for_rollouts`, then :meth:`Store.query_spans` of its final attempt;
3. LightningRL's per-rollout step (:meth:`~agentbolt.lightningrl.LightningRL.collect`: the
   calls it trains, their credit, merging, the ``agentbolt.lightningrl`` section's rules);
4. one output per transition with the fields of verl's ``AgentLoopOutput``; the transition's
   LightningRL description (rollout, group, index, agent, credit, weight version) travels in
   ``extra_fields["agentbolt"]`` to the trainer's advantage step (:mod:`agentbolt_verl.columns`).

What LightningRL left out, and why, is counted and sent to a :class:`MetricsSink` (the binding
drains it into verl's step metrics).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentbolt.errors import SchemaError
from agentbolt.lightningrl import LightningRL, LightningRLConfig
from agentbolt.store import Store
from agentbolt.types import Rollout, RolloutMode, RolloutSpec, RolloutStatus, Task, Transition

from ..columns import EXTRA_KEY, row_extra
from ..config import AgentboltSettings, RolloutSettings

__all__ = [
    "LocalMetricsSink",
    "MetricsSink",
    "RolloutExecutor",
    "RolloutRequest",
    "RolloutResult",
    "decode_task_row",
    "executor_from_settings",
    "task_row",
]

logger = logging.getLogger(__name__)

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
        self._counts: dict[str, float] = {}

    def add(self, counts: Mapping[str, float]) -> None:
        with self._lock:
            for key, value in counts.items():
                self._counts[key] = self._counts.get(key, 0.0) + float(value)

    def drain(self) -> dict[str, float]:
        with self._lock:
            out, self._counts = self._counts, {}
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
    """``trained``, ``empty`` (LightningRL left every call out), ``failed`` or ``timed_out``
    (a failed or timed-out rollout still goes through LightningRL: it trains what has a return)."""
    transitions: list[Transition] = field(default_factory=list)
    """Transitions LightningRL produced (credit set), one per output."""
    outputs: list[dict[str, Any]] = field(default_factory=list)
    """One ``AgentLoopOutput`` field dict per transition (without ``metrics``)."""
    counts: dict[str, float] = field(default_factory=dict)
    """Everything counted for this rollout (sent to the metrics sink)."""
    duration_s: float = 0.0
    """Enqueue to outputs."""


class RolloutExecutor:
    """Runs verl sessions as agentbolt rollouts (see the module docstring).

    Args:
        store: the store the runners poll.
        lightningrl: the config of LightningRL's per-rollout step.
        rollout: rollout settings (timeouts, attempts).
        need_logprobs: verl reads ``rollout_log_probs`` (``rollout.calculate_log_probs``): a call
            whose backend returned no logprobs cannot be packed and is left out (counted
            ``dropped_no_logprobs``).
        sink: receives the counts of every rollout.
    """

    def __init__(
        self,
        store: Store,
        lightningrl: LightningRLConfig | None = None,
        *,
        rollout: RolloutSettings | None = None,
        need_logprobs: bool = True,
        sink: MetricsSink | None = None,
    ) -> None:
        self.store = store
        self.lightningrl = LightningRL(LightningRLConfig.from_value(lightningrl, allow_empty=True))
        self.settings = rollout or RolloutSettings()
        self.need_logprobs = need_logprobs
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
        """Enqueue, wait, LightningRL's per-rollout step; returns the outputs and the counts."""
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
        elif rollout.status != RolloutStatus.SUCCEEDED:
            counts["failed"] += 1
            outcome = "failed"

        spans = await self.store.query_spans([rid], latest_attempt_only=True)
        collected = self.lightningrl.collect([rollout], spans)
        strangers = sorted({t.rollout_id for t in collected.transitions} - {rid})
        if strangers:
            raise SchemaError(f"LightningRL returned transitions of other rollouts {strangers} for {rid!r}")
        report = collected.report
        counts["calls"] += report.calls
        counts.update({f"excluded/{k}": v for k, v in report.excluded.items()})
        transitions = sorted(collected.transitions, key=lambda t: t.index)
        if self.need_logprobs:
            kept = [t for t in transitions if t.response_logprobs is not None]
            counts["dropped_no_logprobs"] += len(transitions) - len(kept)
            transitions = kept
        counts["transitions"] += len(transitions)
        if not transitions:
            counts["empty"] += 1
            if outcome == "trained":
                outcome = "empty"
        episode_return = report.per_rollout[0].final_reward if report.per_rollout else None
        outputs = await self._outputs(request, transitions, episode_return, counts)
        return self._finish(request, rollout, outcome, transitions, counts, start, outputs)

    async def _outputs(
        self,
        request: RolloutRequest,
        transitions: list[Transition],
        episode_return: float | None,
        counts: Counter[str],
    ) -> list[dict[str, Any]]:
        """verl's ``AgentLoopOutput`` fields for each transition (one per LLM call or merged calls)."""
        versions = [await self._weights_version(t.policy_version) for t in transitions]
        fallback = max((request.global_steps or 1) - 1, 0)
        known = [v for v in versions if v is not None]
        low, high = (min(known), max(known)) if known else (fallback, fallback)
        if len(known) < len(versions):
            counts["weights_version_unknown_calls"] += len(versions) - len(known)
        outputs = []
        for t, version in zip(transitions, versions, strict=True):
            mask = t.response_mask if t.response_mask is not None else [1] * len(t.response_ids)
            outputs.append(
                {
                    "prompt_ids": list(t.prompt_ids),
                    "response_ids": list(t.response_ids),
                    "response_mask": [1 if m else 0 for m in mask],
                    "response_logprobs": None if t.response_logprobs is None else list(t.response_logprobs),
                    # verl copies the last output's score onto every output (its reward metrics read
                    # it): the episode return. The row's own credit is in extra_fields.
                    "reward_score": episode_return if episode_return is not None else t.reward,
                    "num_turns": 2 * len(transitions),
                    "extra_fields": {
                        # verl's V1 agent loop copies this from the last output (KeyError if absent)
                        "reward_extra_info": {},
                        # trajectory weight versions, read by verl's off-policy metrics and replay buffer
                        "min_global_steps": low,
                        "max_global_steps": high,
                        EXTRA_KEY: row_extra(t, version),
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
        counts: Counter[str],
        start: float,
        outputs: list[dict[str, Any]],
    ) -> RolloutResult:
        all_counts = {f"{METRICS_PREFIX}{k}": float(v) for k, v in counts.items() if v}
        if self.sink is not None:
            self.sink.add(all_counts)
        if outcome != "trained":
            logger.warning(
                "rollout %s (task %s): %s, %d of %d calls trained",
                rollout.rollout_id,
                request.task_id,
                outcome,
                len(transitions),
                counts["calls"],
            )
        return RolloutResult(
            request=request,
            rollout=rollout,
            outcome=outcome,
            transitions=transitions,
            outputs=outputs,
            counts=all_counts,
            duration_s=time.monotonic() - start,
        )

    async def _weights_version(self, policy_version: int | None) -> int | None:
        """verl's weight version (``global_steps`` at the update) behind a resources version;
        ``None`` when unknown: no version, one the store does not hold, or one below the store's
        first (agentbolt-torch marks its initial weights ``policy_version=0``, never a resources
        version, which the store would refuse as invalid input rather than not find)."""
        if policy_version is None or policy_version < 1:
            return None
        if policy_version not in self._weights_versions:
            try:
                resources = await self.store.get_resources(policy_version)
            except KeyError:
                resources = None
            value = (resources.extra or {}).get("verl_weights_version") if resources is not None else None
            self._weights_versions[policy_version] = int(value) if isinstance(value, int | float) else None
        return self._weights_versions[policy_version]


def executor_from_settings(
    settings: AgentboltSettings,
    *,
    calculate_log_probs: bool,
    sink: MetricsSink | None = None,
    open_store: Callable[[str], Store] | None = None,
) -> RolloutExecutor:
    """A :class:`RolloutExecutor` for the binding's settings (opens the store)."""
    if open_store is None:
        from agentbolt.store import open_store as _open

        open_store = _open
    return RolloutExecutor(
        open_store(settings.store_url),
        settings.lightningrl,
        rollout=settings.rollout,
        need_logprobs=calculate_log_probs,
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
