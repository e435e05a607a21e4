"""LightningRL end to end: rollouts + spans → training rows (credit, advantage, loss weight) + a report.

::

    config = LightningRLConfig(credit="final", advantage="grpo", agent_match=r"^(write|rewrite)_query$")
    lrl = LightningRL(config)
    batch = await lrl.from_store(store, rollout_ids, policy_version=v)  # or lrl.process(rollouts, spans, ...)
    logger.log(batch.report.metrics())
    batch.rows        # TrainingRow: ids, mask, behaviour logprobs, version, advantage, loss_weight

Two steps, which a backend may run in different processes (agentbolt-verl does: the first in its
agent loop, per rollout; the second in its advantage hook, per batch):

1. :meth:`LightningRL.collect`, per rollout: :func:`~agentbolt.lightningrl.extraction.extract_episode`
   (calls, exclusions, reward attachment), the off-policy exclusions (``stale`` when the trained
   ``policy_version`` is known, ``no_logprobs`` under correction), credit assignment over every
   call of the episode, a transition per trainable call, optional trajectory merging.
2. :meth:`LightningRL.to_rows`, per batch: the staleness bound (again, for transitions collected
   before the trained version was known) and its histogram, advantages (grouped by
   ``group_id``), loss weights (``loss_aggregation`` over the rows), and an explicit
   :class:`EmptyBatchError` when nothing is left.

Missing episode return (no final reward span, no ``Rollout.final_reward``, no trailing reward
to promote): :class:`~agentbolt.lightningrl.LightningRLConfig` ``missing_reward="drop"`` (default) leaves the rollout's calls out with reason
``missing_reward``; ``"fill"`` uses ``fill_value`` as the return. Both are counted in
``report.final_reward_sources`` (``missing`` / ``filled``); a missing reward is never a silent 0.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import UserError
from ..types import Rollout, Span, Transition
from .advantage import AdvantageEstimator
from .aggregation import token_count
from .config import LightningRLConfig
from .credit import CreditAssigner
from .episode import Episode, ExclusionReason, LLMCall
from .extraction import extract_episode
from .merge import merge_transitions
from .registry import get_advantage_estimator, get_credit_assigner
from .report import NO_AGENT, AgentStats, BatchReport, CallExclusion, EmptyBatchError, RolloutReport
from .rows import TrainingRow, training_rows

if TYPE_CHECKING:
    from ..plugins.registry import Plugins
    from ..store import Store

__all__ = ["LightningRL", "LightningRLBatch", "off_policy_exclusion"]

_EXAMPLES_PER_REASON = 3


@dataclass(frozen=True)
class LightningRLBatch:
    """The output of :meth:`LightningRL.process`."""

    transitions: list[Transition]
    """Transitions with ``reward`` set, by rollout then call index; after :meth:`LightningRL.to_rows`
    (and :meth:`~LightningRL.process`) also with ``advantage``: the transitions of :attr:`rows`."""
    report: BatchReport
    """What was trained, what was left out and why."""
    episodes: list[Episode] = field(default_factory=list, repr=False)
    """The extracted episodes (for debugging and custom analyses)."""
    rows: list[TrainingRow] = field(default_factory=list)
    """The training rows (advantage and loss weight set); empty after :meth:`LightningRL.collect` alone."""


class _Sampled(Protocol):
    """An LLM call or a transition: what the off-policy rules read."""

    @property
    def policy_version(self) -> int | None: ...
    @property
    def response_logprobs(self) -> list[float] | None: ...


def off_policy_exclusion(
    config: LightningRLConfig, sampled: _Sampled, trained_version: int | None
) -> tuple[ExclusionReason, str] | None:
    """Why a call (or transition) may not be trained at ``trained_version`` under ``config``
    (``max_staleness``, correction needing logprobs), or ``None``.

    The staleness rule applies only when ``trained_version`` is known.
    """
    version = sampled.policy_version
    bound = config.max_staleness
    if bound is not None and trained_version is not None:
        if version is None:
            return ExclusionReason.STALE, "no policy version recorded for the call"
        if trained_version - version > bound:
            return (
                ExclusionReason.STALE,
                f"version {version} is {trained_version - version} behind the trained {trained_version} "
                f"(max_staleness={bound})",
            )
    if config.correction is not None and sampled.response_logprobs is None:
        return ExclusionReason.NO_LOGPROBS, "rollout_is / rollout_rs need the sampling logprobs"
    return None


class LightningRL:
    """Spans → transitions → credit → advantages, configured once and applied per batch.

    Args:
        config: the :class:`~agentbolt.lightningrl.LightningRLConfig` (every choice: credit,
            advantage, agent_match, limits, missing-reward policy, loss aggregation); ``None``
            for the defaults, or a mapping of its fields.
        plugins: plugin manager to resolve credit / estimator names (default:
            :func:`agentbolt.plugins.default_plugins`).
        exclude: a further rule on each call that passed the config's selection and limits:
            ``(reason, detail)`` leaves it out, ``None`` keeps it (the per-policy passes of
            :class:`agentbolt.policies.PolicyLightningRL` use it; credit still sees every call).
        **overrides: :class:`~agentbolt.lightningrl.LightningRLConfig` fields applied on top of
            ``config`` (``LightningRL(agent_match="solver")`` is
            ``LightningRL(LightningRLConfig(agent_match="solver"))``).
    """

    def __init__(
        self,
        config: LightningRLConfig | Mapping[str, Any] | None = None,
        /,
        *,
        plugins: Plugins | None = None,
        exclude: Callable[[LLMCall], tuple[ExclusionReason, str] | None] | None = None,
        **overrides: Any,
    ) -> None:

        self.exclude = exclude
        self.config = cfg = LightningRLConfig.from_value(config, **overrides)
        if isinstance(cfg.credit, str):
            self.credit: CreditAssigner = get_credit_assigner(cfg.credit, plugins=plugins, **cfg.credit_options)
        else:
            self.credit = cfg.credit
        if isinstance(cfg.advantage, str):
            self.advantage: AdvantageEstimator = get_advantage_estimator(
                cfg.advantage, plugins=plugins, **cfg.advantage_options
            )
        else:
            self.advantage = cfg.advantage

    def __repr__(self) -> str:
        cfg = self.config
        return (
            f"LightningRL(credit={self.credit!r}, advantage={self.advantage!r}, agent_match={cfg.agent_match!r}, "
            f"merge={cfg.merge!r}, loss_aggregation={cfg.loss_aggregation!r})"
        )

    # -- per rollout -------------------------------------------------------------------------------

    def extract(self, rollout: Rollout, spans: Sequence[Span], *, policy_version: int | None = None) -> Episode:
        """The episode of one rollout, with this configuration's selection, limits and off-policy
        exclusions (staleness relative to ``policy_version``, the version being trained)."""
        cfg = self.config
        episode = extract_episode(
            rollout,
            spans,
            agent_match=cfg.agent_match,
            allow_retokenized=cfg.allow_retokenized,
            max_prompt_length=cfg.max_prompt_length,
            max_response_length=cfg.max_response_length,
            max_length=cfg.max_length,
            promote_trailing_reward=cfg.promote_trailing_reward,
            unreconciled=cfg.unreconciled,
        )
        exclusions = {}
        for call in episode.trainable_calls:
            why = self.exclude(call) if self.exclude is not None else None
            if why is not None or (why := off_policy_exclusion(cfg, call, policy_version)) is not None:
                exclusions[call.index] = why
        return episode.with_call_exclusions(exclusions) if exclusions else episode

    def assign(self, episode: Episode) -> tuple[Episode, list[Transition], Mapping[str, int]]:
        """Credit for one episode: (episode after the missing-reward policy, its transitions with
        ``reward`` set, credit notes)."""
        credit = self.credit.assign(episode)
        if credit is None:
            if self.config.missing_reward == "fill":
                assert self.config.fill_value is not None
                episode = episode.with_final_reward(float(self.config.fill_value))
                credit = self.credit.assign(episode)
                if credit is None:
                    raise UserError(f"credit assigner {self.credit!r} assigned nothing even with the return filled")
            else:
                return episode.with_exclusion(ExclusionReason.MISSING_REWARD, "no episode return"), [], {}
        if len(credit.rewards) != len(episode.calls):
            raise UserError(
                f"credit assigner {self.credit!r} returned {len(credit.rewards)} rewards for "
                f"{len(episode.calls)} calls of rollout {episode.rollout_id!r}"
            )
        rollout = episode.rollout
        transitions = []
        for call in episode.trainable_calls:
            assert call.prompt_ids is not None and call.response_ids is not None
            metadata: dict[str, Any] = {}
            if call.response_id is not None:
                metadata["response_id"] = call.response_id
            if credit.components:
                metadata["credit"] = dict(credit.components[call.index])
            transitions.append(
                Transition(
                    rollout_id=rollout.rollout_id,
                    attempt_id=episode.attempt_id,
                    group_id=rollout.group_id,
                    task_id=rollout.task_id,
                    index=call.index,
                    agent_name=call.agent_name,
                    prompt_ids=call.prompt_ids,
                    response_ids=call.response_ids,
                    response_logprobs=call.response_logprobs,
                    reward=credit.rewards[call.index],
                    policy_version=call.policy_version,
                    span_id=call.span_id,
                    token_source=call.token_source,
                    finish_reason=call.finish_reason,
                    metadata=metadata,
                )
            )
        return episode, transitions, credit.notes

    # -- per batch ---------------------------------------------------------------------------------

    def process(
        self,
        rollouts: Sequence[Rollout],
        spans: Mapping[str, Sequence[Span]] | Sequence[Span],
        *,
        policy_version: int | None = None,
    ) -> LightningRLBatch:
        """Training rows and the report for a batch of rollouts: :meth:`collect` then :meth:`to_rows`.

        Args:
            rollouts: the rollouts (normally finished).
            spans: their spans, by rollout id (as ``store.query_spans`` returns them) or as one
                sequence (grouped by ``Span.rollout_id``).
            policy_version: the policy version about to be trained: the staleness bound
                (``max_staleness``) is measured from it, and the report's ``staleness``
                histogram. Required when ``max_staleness`` is set.

        Raises:
            EmptyBatchError: no transition is left (unless ``allow_empty``); the message and
                ``.report`` give the reasons and counts.
        """
        collected = self.collect(rollouts, spans, policy_version=policy_version)
        return self.to_rows(
            collected.transitions, policy_version=policy_version, report=collected.report, episodes=collected.episodes
        )

    def collect(
        self,
        rollouts: Sequence[Rollout],
        spans: Mapping[str, Sequence[Span]] | Sequence[Span],
        *,
        policy_version: int | None = None,
    ) -> LightningRLBatch:
        """The per-rollout step: transitions with credit (``reward``), merged when configured, no
        advantages and no rows yet; the report of what was extracted. Never raises
        :class:`EmptyBatchError` (:meth:`to_rows` does)."""
        by_rollout = _group_spans(spans)
        report = BatchReport(missing_reward_policy=self.config.missing_reward, policy_version=policy_version)
        excluded: Counter[str] = Counter()
        sources: Counter[str] = Counter()
        rewards: Counter[str] = Counter()
        extraction: Counter[str] = Counter()
        credit_notes: Counter[str] = Counter()
        reconciliation: Counter[str] = Counter()
        per_agent: dict[str, AgentStats] = {}
        examples: dict[str, int] = {}
        episodes: list[Episode] = []
        transitions: list[Transition] = []
        for rollout in rollouts:
            episode = self.extract(rollout, by_rollout.get(rollout.rollout_id, ()), policy_version=policy_version)
            episode, produced, notes = self.assign(episode)
            episodes.append(episode)
            transitions.extend(produced)
            credit_notes.update(notes)
            sources[episode.final_source or "missing"] += 1
            ep_notes = Counter(episode.notes)
            if not rollout.status.is_final:
                ep_notes["rollout_not_finished"] += 1
            for key, n in ep_notes.items():
                (rewards if key.startswith("rewards_") else extraction)[key] += n
            rewards["on_untrained_calls"] += sum(
                1 for r in episode.rewards if r.call_index is not None and not episode.calls[r.call_index].trainable
            )
            ro_excluded: Counter[str] = Counter()
            for call in episode.calls:
                stats = per_agent.setdefault(call.agent_name or NO_AGENT, AgentStats())
                stats.calls += 1
                if call.trainable:
                    stats.trained += 1
                    continue
                assert call.exclusion is not None
                reason = call.exclusion.value
                stats.excluded[reason] = stats.excluded.get(reason, 0) + 1
                ro_excluded[reason] += 1
                if examples.get(reason, 0) < _EXAMPLES_PER_REASON:
                    examples[reason] = examples.get(reason, 0) + 1
                    report.examples.append(
                        CallExclusion(
                            rollout_id=rollout.rollout_id,
                            index=call.index,
                            span_id=call.span_id,
                            agent_name=call.agent_name,
                            reason=reason,
                            detail=call.exclusion_detail,
                        )
                    )
            excluded.update(ro_excluded)
            rec = episode.reconciliation
            if rec is not None:
                reconciliation["gateway_calls"] += rec.gateway_calls
                reconciliation["calls"] += rec.calls
                reconciliation["unjoined_llm_spans"] += rec.unjoined_llm_spans
                reconciliation["flagged_rollouts"] += rec.flag is not None
            report.per_rollout.append(
                RolloutReport(
                    rollout_id=rollout.rollout_id,
                    group_id=rollout.group_id,
                    attempt_id=episode.attempt_id,
                    status=rollout.status.value,
                    calls=len(episode.calls),
                    trained=len(produced),
                    excluded=dict(ro_excluded),
                    final_reward=episode.final_reward,
                    final_source=episode.final_source,
                    notes={**ep_notes, **notes},
                    gateway_calls=rec.gateway_calls if rec is not None else None,
                    unjoined_llm_spans=rec.unjoined_llm_spans if rec is not None else 0,
                    flag=rec.flag if rec is not None else None,
                )
            )
        report.trained_calls = len(transitions)
        if self.config.merge and transitions:
            merged = merge_transitions(transitions, max_length=self.config.max_length)
            transitions = merged.transitions
            report.merge = merged.stats
        report.rollouts = len(rollouts)
        report.calls = sum(len(e.calls) for e in episodes)
        report.excluded = dict(excluded)
        report.per_agent = per_agent
        report.final_reward_sources = dict(sources)
        report.rewards = {k: v for k, v in rewards.items() if v}
        report.extraction = dict(extraction)
        report.credit = dict(credit_notes)
        report.reconciliation = dict(reconciliation)
        _count_output(report, transitions)
        return LightningRLBatch(transitions=transitions, report=report, episodes=episodes)

    def to_rows(
        self,
        transitions: Sequence[Transition],
        *,
        policy_version: int | None = None,
        report: BatchReport | None = None,
        episodes: Sequence[Episode] = (),
    ) -> LightningRLBatch:
        """The per-batch step: the staleness bound, advantages and loss weights of transitions
        with credit (from :meth:`collect`, possibly gathered from several processes).

        Args:
            transitions: transitions with ``reward`` set (``collect``'s), in any order.
            policy_version: the version being trained (required when ``max_staleness`` is set):
                transitions beyond the bound are dropped (``excluded["stale"]``, counting each
                call of a merged row) and the kept ones fill ``report.staleness``.
            report: :meth:`collect`'s report, completed here (a fresh one otherwise).
            episodes: carried into the result.

        Raises:
            EmptyBatchError: no row is left (unless ``allow_empty``).
        """
        cfg = self.config
        if cfg.max_staleness is not None and policy_version is None:
            raise UserError(
                f"max_staleness={cfg.max_staleness} needs the version being trained: pass policy_version= to "
                "LightningRL.process / to_rows"
            )
        if report is None:
            report = BatchReport(missing_reward_policy=cfg.missing_reward)
            report.trained_calls = sum(_calls(t) for t in transitions)
        else:
            report = report.model_copy(deep=True)
        report.policy_version = policy_version
        kept: list[Transition] = []
        staleness: Counter[str] = Counter()
        excluded = Counter(report.excluded)
        for t in transitions:
            if (why := off_policy_exclusion(cfg, t, policy_version)) is not None:
                calls = _calls(t)
                excluded[why[0].value] += calls
                report.trained_calls -= min(calls, report.trained_calls)
                stats = report.per_agent.setdefault(t.agent_name or NO_AGENT, AgentStats())
                stats.trained -= min(calls, stats.trained)
                stats.excluded[why[0].value] = stats.excluded.get(why[0].value, 0) + calls
                continue
            kept.append(t)
            if policy_version is not None:
                staleness["unknown" if t.policy_version is None else str(policy_version - t.policy_version)] += 1
        result = self.advantage.estimate(kept)
        if result.dropped:
            excluded[ExclusionReason.MISSING_REWARD.value] += len(result.dropped)
        report.excluded = dict(excluded)
        report.advantage = dict(result.stats)
        report.staleness = dict(staleness)
        rows = training_rows(result.transitions, cfg.loss_aggregation)
        _count_output(report, result.transitions)
        if not rows and not cfg.allow_empty:
            raise EmptyBatchError(report)
        return LightningRLBatch(transitions=list(result.transitions), report=report, episodes=list(episodes), rows=rows)

    async def from_store(
        self, store: Store, rollout_ids: Sequence[str], *, policy_version: int | None = None
    ) -> LightningRLBatch:
        """:meth:`process` on rollouts read from ``store`` (final attempts' spans, one batch query)."""
        rollouts = await store.get_rollouts(rollout_ids)
        spans = await store.query_spans([r.rollout_id for r in rollouts], latest_attempt_only=True)
        return self.process(rollouts, spans, policy_version=policy_version)


def _group_spans(spans: Mapping[str, Sequence[Span]] | Sequence[Span]) -> Mapping[str, Sequence[Span]]:
    if isinstance(spans, Mapping):
        return spans
    out: dict[str, list[Span]] = {}
    for s in spans:
        if s.rollout_id is None:
            raise UserError(f"span {s.span_id} ({s.name}) has no rollout_id; pass spans by rollout id instead")
        out.setdefault(s.rollout_id, []).append(s)
    return out


def _count_output(report: BatchReport, transitions: Sequence[Transition]) -> None:
    report.rollouts_with_transitions = len({t.rollout_id for t in transitions})
    report.transitions = len(transitions)
    report.tokens = sum(token_count(t) for t in transitions)


def _calls(t: Transition) -> int:
    """LLM calls a transition stands for (a merged row stands for several)."""
    merged = t.metadata.get("merged_indices")
    return len(merged) if isinstance(merged, list) else 1
