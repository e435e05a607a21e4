"""What LightningRL reports about a batch: what was trained, what was left out and why."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from ..errors import AgentboltError

__all__ = ["AgentStats", "BatchReport", "CallExclusion", "EmptyBatchError", "RolloutReport"]

_MODEL = ConfigDict(extra="forbid", use_attribute_docstrings=True)

NO_AGENT = "<none>"
"""Key of calls with no agent name in :attr:`BatchReport.per_agent`."""

_HINTS = {
    "no_token_ids": (
        "the gateway recorded no token ids (token_source=missing), or a framework LLM span has no gateway "
        "span with its response id: route the agent's calls through the rollout's base URL and use a "
        "backend that returns token ids"
    ),
    "retokenized": "token ids were reconstructed from text; pass allow_retokenized=True to train on them",
    "token_drift": (
        "retokenized ids disagree with the backend's token counts or text: use the policy's own tokenizer "
        "(Trainer(capture=CaptureOptions(tokenizer=...))) and chat template, or a backend that returns token ids"
    ),
    "agent_not_selected": "agent_match selected none of these calls",
    "over_length": "raise max_prompt_length / max_response_length / max_length",
    "failed_call": "the upstream failed these calls; see the status message of the gateway spans",
    "malformed": "token ids or logprobs are malformed; see the examples",
    "empty_response": "the responses have no tokens",
    "unreconciled": (
        "the rollout's framework spans and gateway calls disagree (an instrumentation LLM span with a response "
        "joined no gateway call): build every client from resources.llm.base_url so each model call passes the "
        "gateway; see the rollout's flag in per_rollout (or agentbolt doctor); unreconciled='train' trains anyway"
    ),
    "stale": (
        "sampled by a policy version more than max_staleness versions older than the trained one, or by an "
        "unrecorded version: raise max_staleness, or make the inference server report its version"
    ),
    "no_logprobs": (
        "off-policy correction (rollout_is / rollout_rs) needs the sampling logprobs: use a backend that "
        "returns logprobs through the gateway"
    ),
    "no_policy": "no policy's match selects these agents (policies by role): add them to a policy to train them",
    "policy_mismatch": (
        "served by another policy (or the base model) than their agent's: the gateway routes by the agent name "
        "it knows when the call is made (X-Agentbolt-Agent-Name header or CaptureOptions(agent_names=...)), which "
        "must agree with the name the framework adapter records"
    ),
    "missing_reward": (
        "no episode return: return a float from the agent or emit a final reward, "
        "or use missing_reward='fill' with an explicit fill_value"
    ),
}


class CallExclusion(BaseModel):
    """One call that produced no transition."""

    model_config = _MODEL

    rollout_id: str
    """Rollout of the call."""
    index: int
    """Call index within the rollout."""
    span_id: str
    """The call's gateway span (else framework span)."""
    agent_name: str | None
    """Agent of the call."""
    reason: str
    """An :class:`~agentbolt.lightningrl.episode.ExclusionReason` value."""
    detail: str | None = None
    """Specifics."""


class AgentStats(BaseModel):
    """Calls of one agent in the batch."""

    model_config = _MODEL

    calls: int = 0
    """LLM calls seen."""
    trained: int = 0
    """Calls that became transitions."""
    excluded: dict[str, int] = Field(default_factory=dict)
    """Excluded calls by reason."""


class RolloutReport(BaseModel):
    """What happened to one rollout."""

    model_config = _MODEL

    rollout_id: str
    """The rollout."""
    group_id: str | None
    """Its group."""
    attempt_id: str | None
    """The attempt whose spans were used."""
    status: str
    """Rollout status."""
    calls: int
    """LLM calls in the final attempt."""
    trained: int
    """Calls that became transitions."""
    excluded: dict[str, int] = Field(default_factory=dict)
    """Excluded calls by reason."""
    final_reward: float | None
    """Episode return used (after any fill)."""
    final_source: str | None
    """``span``, ``rollout``, ``trailing_reward``, ``filled`` or ``None`` (missing)."""
    notes: dict[str, int] = Field(default_factory=dict)
    """Extraction and credit counters."""
    gateway_calls: int | None = None
    """Gateway LLM-call spans of the final attempt (``None`` in reports written before reconciliation)."""
    unjoined_llm_spans: int = 0
    """Framework / instrumentation LLM spans that joined no gateway call (kept as operations, not calls)."""
    flag: str | None = None
    """Why reconciliation flagged the rollout (its calls are then excluded as ``unreconciled``);
    ``None`` when its LightningRL calls are its gateway calls and nothing disagrees."""


class BatchReport(BaseModel):
    """Structured account of one LightningRL batch, for logs and metrics."""

    model_config = _MODEL

    rollouts: int = 0
    """Rollouts given."""
    rollouts_with_transitions: int = 0
    """Rollouts that produced at least one transition."""
    calls: int = 0
    """LLM calls seen (final attempts only)."""
    trained_calls: int = 0
    """Calls that became transitions (before merging)."""
    transitions: int = 0
    """Transitions returned (after merging)."""
    tokens: int = 0
    """Trainable response tokens (mask 1) returned."""
    excluded: dict[str, int] = Field(default_factory=dict)
    """Excluded calls by reason."""
    per_agent: dict[str, AgentStats] = Field(default_factory=dict)
    """Calls by agent name (``<none>`` for calls without one)."""
    final_reward_sources: dict[str, int] = Field(default_factory=dict)
    """Rollouts by where their episode return came from (``missing`` when it had none)."""
    missing_reward_policy: str = "drop"
    """``drop`` or ``fill``."""
    rewards: dict[str, int] = Field(default_factory=dict)
    """Reward spans by attachment (``rewards_preceding``, ``rewards_unattached``, ...) and
    ``on_untrained_calls`` (intermediate rewards attached to calls that were not trained)."""
    extraction: dict[str, int] = Field(default_factory=dict)
    """Other extraction counters (spans of other attempts, joins, unsequenced spans, ...)."""
    reconciliation: dict[str, int] = Field(default_factory=dict)
    """Summed over rollouts: ``gateway_calls``, ``calls`` (LightningRL's; equal to the gateway calls
    wherever a rollout has any), ``unjoined_llm_spans`` (framework LLM spans kept as operations)
    and ``flagged_rollouts``."""
    credit: dict[str, int] = Field(default_factory=dict)
    """Counters from the credit assigner (e.g. ``air.tool_error.tool_call_id``)."""
    advantage: dict[str, float | int | str] = Field(default_factory=dict)
    """Statistics from the advantage estimator."""
    merge: dict[str, int] = Field(default_factory=dict)
    """Merging counters (empty when merging is off)."""
    policy_version: int | None = None
    """The policy version being trained, when given (``process(..., policy_version=)``)."""
    staleness: dict[str, int] = Field(default_factory=dict)
    """Trained transitions by staleness (trained version minus the version that sampled them),
    when ``policy_version`` is given; transitions of an unrecorded version are under ``unknown``."""
    examples: list[CallExclusion] = Field(default_factory=list)
    """Up to three excluded calls per reason."""
    per_rollout: list[RolloutReport] = Field(default_factory=list)
    """One entry per rollout."""

    def summary(self) -> str:
        """One paragraph: counts, exclusions by reason with hints, missing rewards."""
        lines = [
            f"{self.rollouts} rollouts, {self.calls} LLM calls, {self.trained_calls} trained, "
            f"{self.transitions} transitions ({self.tokens} tokens)"
        ]
        rec = self.reconciliation
        if rec:
            lines.append(
                f"  reconciliation: {rec.get('gateway_calls', 0)} gateway calls, {rec.get('calls', 0)} LightningRL "
                f"calls, {rec.get('unjoined_llm_spans', 0)} unjoined framework LLM spans (operations), "
                f"{rec.get('flagged_rollouts', 0)} rollouts flagged"
            )
        for ro in self.per_rollout:
            if ro.flag is not None:
                lines.append(f"  flagged rollout {ro.rollout_id}: {ro.flag}")
        for reason, n in sorted(self.excluded.items(), key=lambda kv: -kv[1]):
            lines.append(f"  excluded {n} x {reason}: {_HINTS.get(reason, '')}".rstrip(": "))
        missing = self.final_reward_sources.get("missing", 0)
        if missing:
            lines.append(f"  {missing} rollouts had no episode return (policy {self.missing_reward_policy!r})")
        if self.per_agent:
            agents = ", ".join(f"{k}: {v.trained}/{v.calls}" for k, v in sorted(self.per_agent.items()))
            lines.append(f"  trained/calls per agent: {agents}")
        for ex in self.examples[:6]:
            lines.append(
                f"  e.g. rollout {ex.rollout_id} call {ex.index} (span {ex.span_id}, agent {ex.agent_name!r}): "
                f"{ex.reason}" + (f" - {ex.detail}" if ex.detail else "")
            )
        return "\n".join(lines)

    def metrics(self, prefix: str = "lightningrl/") -> dict[str, float]:
        """A flat ``{name: number}`` view for metric loggers."""
        out: dict[str, float] = {
            f"{prefix}{k}": float(getattr(self, k))
            for k in ("rollouts", "rollouts_with_transitions", "calls", "trained_calls", "transitions", "tokens")
        }
        sections = ("excluded", "final_reward_sources", "rewards", "extraction", "reconciliation", "credit", "merge")
        for section in (*sections, "staleness"):
            for k, v in getattr(self, section).items():
                out[f"{prefix}{section}/{k}"] = float(v)
        for k, v in self.advantage.items():
            if isinstance(v, int | float):
                out[f"{prefix}advantage/{k}"] = float(v)
        known = {int(k): n for k, n in self.staleness.items() if k != "unknown"}
        if known:
            out[f"{prefix}staleness_mean"] = sum(k * n for k, n in known.items()) / sum(known.values())
            out[f"{prefix}staleness_max"] = float(max(known))
        for name, stats in self.per_agent.items():
            out[f"{prefix}agent/{name}/calls"] = float(stats.calls)
            out[f"{prefix}agent/{name}/trained"] = float(stats.trained)
        return out


class EmptyBatchError(AgentboltError):
    """LightningRL produced no transition from a batch; :attr:`report` says why."""

    def __init__(self, report: BatchReport) -> None:
        if report.calls == 0:
            why = (
                "no LLM-call spans were found in the final attempts: does the agent call the LLM through "
                "resources.llm.base_url (the gateway)?"
            )
        else:
            why = "every call was left out"
        super().__init__(f"LightningRL produced an empty batch: {why}\n{report.summary()}")
        self.report = report
