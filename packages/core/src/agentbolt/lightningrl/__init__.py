"""LightningRL: spans → transitions → credit → advantages.

The learning side of agentbolt, pure Python (no torch, no numpy):

- :mod:`.episode` — the episode of a rollout: its LLM calls and rewards (data model);
- :mod:`.extraction` — spans → episode (with :mod:`.calls` joining LLM-call spans, :mod:`.reward_attachment` placing rewards);
- :mod:`.credit`, :mod:`.air` — credit assigners (``final``, ``discounted``, ``intermediate``, ``air``);
- :mod:`.advantage` — advantage estimators (``grpo``, ``rloo``, ``reinforce_pp``), rollout or transition level;
- :mod:`.aggregation` — loss aggregation weights (``rollout-mean-token-mean`` and verl's modes), the one primitive algorithms use;
- :mod:`.config` — :class:`LightningRLConfig`, the one place these choices are spelled;
- :mod:`.correction` — off-policy correction (verl's token/sequence TIS and rejection), framework-free;
- :mod:`.merge` — trajectory merging into masked sequences;
- :mod:`.rows` — :class:`TrainingRow`, what a backend trains on, and per-token loss weights;
- :mod:`.pipeline` — :class:`LightningRL`, all of the above in one call, with a report.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from .advantage import GRPO, RLOO, AdvantageEstimator, AdvantageResult, ReinforcePlusPlus
    from .aggregation import (
        DEFAULT_LOSS_AGGREGATION,
        LOSS_AGGREGATIONS,
        LossAggregation,
        check_loss_aggregation,
        loss_weights,
        row_weights,
        token_count,
        token_weights,
    )
    from .air import AIRCredit, AIRRule, AIRSignal, ExceptionRule, FinishReasonRule, FormatRule, ToolCallRule
    from .config import LightningRLConfig
    from .correction import RS_OPTIONS, CorrectionResult, RolloutCorrection, rollout_correction
    from .credit import Credit, CreditAssigner, DiscountedCredit, FinalCredit, IntermediateCredit, discounted_returns
    from .episode import (
        AgentMatch,
        Episode,
        ExclusionReason,
        LLMCall,
        Reconciliation,
        RewardRecord,
        agent_selector,
    )
    from .extraction import extract_episode
    from .merge import MergeResult, merge_transitions
    from .pipeline import LightningRL, LightningRLBatch, off_policy_exclusion
    from .registry import get_advantage_estimator, get_credit_assigner, register_builtins
    from .report import AgentStats, BatchReport, CallExclusion, EmptyBatchError, RolloutReport
    from .rows import TrainingRow, token_loss_weights, training_rows

_EXPORTS: dict[str, str] = {
    "DEFAULT_LOSS_AGGREGATION": "aggregation",
    "GRPO": "advantage",
    "LOSS_AGGREGATIONS": "aggregation",
    "LightningRLConfig": "config",
    "RS_OPTIONS": "correction",
    "CorrectionResult": "correction",
    "RolloutCorrection": "correction",
    "rollout_correction": "correction",
    "off_policy_exclusion": "pipeline",
    "TrainingRow": "rows",
    "token_loss_weights": "rows",
    "training_rows": "rows",
    "LossAggregation": "aggregation",
    "check_loss_aggregation": "aggregation",
    "row_weights": "aggregation",
    "RLOO": "advantage",
    "AIRCredit": "air",
    "AIRRule": "air",
    "AIRSignal": "air",
    "AdvantageEstimator": "advantage",
    "AdvantageResult": "advantage",
    "AgentMatch": "episode",
    "AgentStats": "report",
    "BatchReport": "report",
    "CallExclusion": "report",
    "Credit": "credit",
    "CreditAssigner": "credit",
    "DiscountedCredit": "credit",
    "EmptyBatchError": "report",
    "Episode": "episode",
    "ExceptionRule": "air",
    "ExclusionReason": "episode",
    "FinalCredit": "credit",
    "FinishReasonRule": "air",
    "FormatRule": "air",
    "IntermediateCredit": "credit",
    "LLMCall": "episode",
    "Reconciliation": "episode",
    "LightningRL": "pipeline",
    "LightningRLBatch": "pipeline",
    "MergeResult": "merge",
    "ReinforcePlusPlus": "advantage",
    "RewardRecord": "episode",
    "RolloutReport": "report",
    "ToolCallRule": "air",
    "agent_selector": "episode",
    "discounted_returns": "credit",
    "extract_episode": "extraction",
    "get_advantage_estimator": "registry",
    "get_credit_assigner": "registry",
    "loss_weights": "aggregation",
    "merge_transitions": "merge",
    "register_builtins": "registry",
    "token_count": "aggregation",
    "token_weights": "aggregation",
}
"""Public name -> submodule; imported on first access (PEP 562) so plugin loading stays cheap."""

__all__ = [
    "DEFAULT_LOSS_AGGREGATION",
    "GRPO",
    "LOSS_AGGREGATIONS",
    "RLOO",
    "RS_OPTIONS",
    "AIRCredit",
    "AIRRule",
    "AIRSignal",
    "AdvantageEstimator",
    "AdvantageResult",
    "AgentMatch",
    "AgentStats",
    "BatchReport",
    "CallExclusion",
    "CorrectionResult",
    "Credit",
    "CreditAssigner",
    "DiscountedCredit",
    "EmptyBatchError",
    "Episode",
    "ExceptionRule",
    "ExclusionReason",
    "FinalCredit",
    "FinishReasonRule",
    "FormatRule",
    "IntermediateCredit",
    "LLMCall",
    "LightningRL",
    "LightningRLBatch",
    "LightningRLConfig",
    "LossAggregation",
    "MergeResult",
    "Reconciliation",
    "ReinforcePlusPlus",
    "RewardRecord",
    "RolloutCorrection",
    "RolloutReport",
    "ToolCallRule",
    "TrainingRow",
    "agent_selector",
    "check_loss_aggregation",
    "discounted_returns",
    "extract_episode",
    "get_advantage_estimator",
    "get_credit_assigner",
    "loss_weights",
    "merge_transitions",
    "off_policy_exclusion",
    "register_builtins",
    "rollout_correction",
    "row_weights",
    "token_count",
    "token_loss_weights",
    "token_weights",
    "training_rows",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
