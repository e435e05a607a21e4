"""LightningRL once per policy: each policy's training rows from the calls of its own agents.

::

    lrl = PolicyLightningRL(policies, LightningRLConfig(agent_match=r"^(write|rewrite)_query$"))
    batch = lrl.process(rollouts, spans, policy_versions={"writer": 3, "rewriter": 2})
    batch.rows_of("writer")      # TrainingRow s that update only the writer's weights
    batch.report                 # every call: trained by its policy, or left out and why
    batch.metrics()              # lightningrl/* (all calls) and lightningrl/policy/<name>/*

Each policy's pass is a :class:`~agentbolt.lightningrl.LightningRL` with the policy's own
config (its :attr:`~agentbolt.policies.PolicySpec.lightningrl`, else the shared one) whose
``agent_match`` also requires the agent to be the policy's. Credit is assigned over every call
of the episode, as always; advantages are estimated over the policy's own transitions, so a
role's baseline is the group's rollouts in which that role acted (GRPO: the rewriter's calls are
compared with the other rollouts of the task that needed a rewrite, not with those that did not).
A call served by another policy than its agent's (``X-Agentbolt-Policy`` recorded by the gateway)
is left out with ``policy_mismatch``: training it would be off-policy by construction.

Staleness: each policy's calls are measured from its own version. A policy config of its own
without ``max_staleness`` takes the shared config's: the asynchronous run's bound (``Trainer.fit(...,
max_staleness=K)``) holds for every policy unless one declares a bound of its own.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..lightningrl.config import LightningRLConfig
from ..lightningrl.episode import ExclusionReason, LLMCall, agent_selector
from ..lightningrl.pipeline import LightningRL, LightningRLBatch
from ..lightningrl.report import NO_AGENT, AgentStats, BatchReport, CallExclusion, EmptyBatchError
from ..lightningrl.rows import TrainingRow
from ..types import Rollout, Span, Transition
from .spec import Policies

if TYPE_CHECKING:
    from ..plugins.registry import Plugins

__all__ = ["PolicyBatch", "PolicyLightningRL"]

_EXAMPLES_PER_REASON = 3


@dataclass(frozen=True)
class PolicyBatch:
    """What :meth:`PolicyLightningRL.process` returns."""

    batches: dict[str, LightningRLBatch]
    """Each policy's pass (every policy, possibly with no rows), in declaration order."""
    report: BatchReport
    """Every call of the batch once: trained by its agent's policy, or left out and why
    (``no_policy``, ``policy_mismatch`` and LightningRL's own reasons)."""
    policy_reports: dict[str, BatchReport]
    """Each policy's report restricted to its own agents' calls."""

    @property
    def rows(self) -> list[TrainingRow]:
        """Every policy's rows, policy after policy."""
        return [row for batch in self.batches.values() for row in batch.rows]

    @property
    def transitions(self) -> list[Transition]:
        """Every policy's transitions (with advantages), policy after policy."""
        return [tr for batch in self.batches.values() for tr in batch.transitions]

    def rows_of(self, policy: str) -> list[TrainingRow]:
        """The rows that train ``policy``."""
        return list(self.batches[policy].rows)

    def metrics(self, prefix: str = "lightningrl/") -> dict[str, float]:
        """``{prefix}*`` over every call (as for one policy) and ``{prefix}policy/<name>/*`` per policy."""
        out = self.report.metrics(prefix)
        for name, report in self.policy_reports.items():
            own = report.metrics(f"{prefix}policy/{name}/")
            out.update({k: v for k, v in own.items() if "/agent/" not in k})
        return out


class PolicyLightningRL:
    """LightningRL per policy (see the module doc).

    Args:
        policies: the run's :class:`~agentbolt.policies.Policies`.
        config: the LightningRL config of policies that declare none of their own.
        plugins: plugin manager for credit / estimator names.
    """

    def __init__(
        self,
        policies: Policies,
        config: LightningRLConfig | Mapping[str, Any] | None = None,
        *,
        plugins: Plugins | None = None,
    ) -> None:
        self.policies = policies
        self.config = LightningRLConfig.from_value(config)
        routed = not policies.is_shared
        self.passes: dict[str, LightningRL] = {}
        self._configs: dict[str, LightningRLConfig] = {}
        for name, spec in policies.items():
            own = spec.lightningrl or self.config
            if own.max_staleness is None and self.config.max_staleness is not None:
                own = own.replace(max_staleness=self.config.max_staleness)  # the run's bound holds for every policy
            self._configs[name] = own
            select = agent_selector(own.agent_match)
            self.passes[name] = LightningRL(
                own.replace(agent_match=_OwnAgents(policies, name, select), allow_empty=True),
                plugins=plugins,
                exclude=_ServedBy(name) if routed else None,
            )

    def config_of(self, policy: str) -> LightningRLConfig:
        """The LightningRL config ``policy`` trains with (its own, else the shared one; its own
        without ``max_staleness`` takes the shared one's)."""
        return self._configs[policy]

    def process(
        self,
        rollouts: Sequence[Rollout],
        spans: Mapping[str, Sequence[Span]] | Sequence[Span],
        *,
        policy_versions: Mapping[str, int] | None = None,
    ) -> PolicyBatch:
        """Each policy's rows and the reports of a batch of rollouts.

        Args:
            rollouts, spans: as for :meth:`LightningRL.process <agentbolt.lightningrl.LightningRL.process>`.
            policy_versions: the version of each policy about to be trained (the staleness bound
                of each policy is measured from its own version).

        Raises:
            EmptyBatchError: no policy has a row (unless the shared config has ``allow_empty``).
        """
        versions = dict(policy_versions or {})
        batches = {
            name: lrl.process(rollouts, spans, policy_version=versions.get(name)) for name, lrl in self.passes.items()
        }
        report = self._combined(rollouts, batches)
        owners = self.policies.agents_of(None if a == NO_AGENT else a for a in report.per_agent)
        policy_reports = {
            name: _own_report(batch.report, {a for a, p in owners.items() if p == name})
            for name, batch in batches.items()
        }
        result = PolicyBatch(batches=batches, report=report, policy_reports=policy_reports)
        if not result.rows and not self.config.allow_empty:
            raise EmptyBatchError(report)
        return result

    def _combined(self, rollouts: Sequence[Rollout], batches: Mapping[str, LightningRLBatch]) -> BatchReport:
        """One report over every call, each call read from its own policy's pass."""
        first = next(iter(batches.values()))
        base = first.report
        report = BatchReport(
            rollouts=base.rollouts,
            calls=base.calls,
            missing_reward_policy=base.missing_reward_policy,
            final_reward_sources=dict(base.final_reward_sources),
            rewards=dict(base.rewards),
            extraction=dict(base.extraction),
            credit=dict(base.credit),
        )
        seen: set[tuple[str, str]] = set()
        for batch in batches.values():  # a rollout in quarantine in any pass, once
            for q in batch.report.quarantined:
                if (q.rollout_id, q.reason) not in seen:
                    seen.add((q.rollout_id, q.reason))
                    report.quarantined.append(q)
        per_agent: dict[str, AgentStats] = {}
        excluded: Counter[str] = Counter()
        shown: Counter[str] = Counter()
        for i, episode in enumerate(first.episodes):
            for call in episode.calls:
                owner = self.policies.policy_for(call.agent_name)
                stats = per_agent.setdefault(call.agent_name or NO_AGENT, AgentStats())
                stats.calls += 1
                detail: str | None
                if owner is None:
                    reason, detail = ExclusionReason.NO_POLICY.value, f"agent {call.agent_name!r}"
                else:
                    own = batches[owner].episodes[i].calls[call.index]
                    if own.trainable:
                        stats.trained += 1
                        continue
                    assert own.exclusion is not None
                    reason, detail = own.exclusion.value, own.exclusion_detail
                stats.excluded[reason] = stats.excluded.get(reason, 0) + 1
                excluded[reason] += 1
                if shown[reason] < _EXAMPLES_PER_REASON:
                    shown[reason] += 1
                    report.examples.append(
                        CallExclusion(
                            rollout_id=rollouts[i].rollout_id,
                            index=call.index,
                            span_id=call.span_id,
                            agent_name=call.agent_name,
                            reason=reason,
                            detail=detail,
                        )
                    )
        report.per_agent = per_agent
        report.excluded = dict(excluded)
        report.trained_calls = sum(b.report.trained_calls for b in batches.values())
        report.transitions = sum(b.report.transitions for b in batches.values())
        report.tokens = sum(b.report.tokens for b in batches.values())
        report.rollouts_with_transitions = len({t.rollout_id for b in batches.values() for t in b.transitions})
        staleness: Counter[str] = Counter()
        for b in batches.values():
            staleness.update(b.report.staleness)
        report.staleness = dict(staleness)
        return report


class _OwnAgents:
    """``agent_match`` of one policy's pass: the agent is the policy's and its config selects it."""

    def __init__(self, policies: Policies, name: str, select: Callable[[str | None], bool]) -> None:
        self.policies, self.name, self.select = policies, name, select

    def __call__(self, agent_name: str | None) -> bool:
        return self.policies.policy_for(agent_name) == self.name and self.select(agent_name)

    def __repr__(self) -> str:
        return f"<agents of policy {self.name!r}>"


class _ServedBy:
    """Leave out a call that another policy (or the base model) served."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, call: LLMCall) -> tuple[ExclusionReason, str] | None:
        if call.policy_name == self.name:
            return None
        served = f"policy {call.policy_name!r}" if call.policy_name else "the base model (no policy recorded)"
        return (
            ExclusionReason.POLICY_MISMATCH,
            f"agent {call.agent_name!r} belongs to policy {self.name!r} but the call was served by {served}",
        )


def _own_report(report: BatchReport, agents: set[str | None]) -> BatchReport:
    """``report`` (one policy's pass) without the calls of other policies' agents (all of which
    its ``agent_match`` left out as ``agent_not_selected``)."""
    own = report.model_copy(deep=True)
    keys = {a or NO_AGENT for a in agents}
    excluded = Counter(own.excluded)
    for name, stats in report.per_agent.items():
        if name not in keys:
            excluded.subtract(stats.excluded)
    own.excluded = {k: v for k, v in excluded.items() if v > 0}
    own.per_agent = {k: v for k, v in own.per_agent.items() if k in keys}
    own.calls = sum(s.calls for s in own.per_agent.values())
    own.examples = [e for e in own.examples if (e.agent_name or NO_AGENT) in keys]
    return own
