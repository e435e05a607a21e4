"""LightningRLConfig: every choice of the transitions → loss contract, spelled once.

One frozen, validated object holds what turns a batch of rollouts into a loss: which calls are
trained (selective optimization, length limits, retokenized ids), how credit is assigned, how
advantages are estimated and grouped, what happens to a rollout without a return, and how
per-token losses are aggregated. :class:`~agentbolt.lightningrl.LightningRL` is built from it,
``torch-grpo`` / ``torch-sft`` take it (``lightningrl=``), ``Trainer(lightningrl=...)`` hands it to a
named algorithm, and agentbolt-verl reads it from the ``agentbolt.lightningrl`` section of its
YAML (deriving verl's ``adv_estimator`` and ``loss_agg_mode`` from it)::

    LightningRLConfig(credit="final", advantage="grpo", agent_match=r"^(write|rewrite)_query$",
                      loss_aggregation="rollout-mean-token-mean")

Off-policy training adds a staleness bound and importance-sampling correction, with verl's
names (:mod:`agentbolt.lightningrl.correction`)::

    LightningRLConfig(max_staleness=2, rollout_is="token", rollout_is_threshold=2.0)

Loss aggregation uses verl's names (``token-mean``, ``seq-mean-token-mean``,
``seq-mean-token-sum``) plus ``rollout-mean-token-mean``: the mean over rollouts of each
rollout's token mean, so a rollout with many calls gets no more weight than one with a single
call. The weights are computed by :mod:`agentbolt.lightningrl.aggregation`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..errors import UserError, invalid_fields_message
from .advantage import AdvantageEstimator
from .aggregation import DEFAULT_LOSS_AGGREGATION, LossAggregation
from .correction import RolloutCorrection
from .credit import CreditAssigner
from .episode import agent_selector

__all__ = ["LightningRLConfig"]


class LightningRLConfig(BaseModel):
    """Credit assignment, advantages, selective optimization and loss aggregation (see the module doc).

    Build it with keywords, or from a mapping (a YAML section) with :meth:`from_value`; unknown
    keys and invalid values raise :class:`~agentbolt.errors.UserError`. Frozen: derive variants
    with :meth:`replace`.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True, use_attribute_docstrings=True)

    credit: str | CreditAssigner = "final"
    """Credit assigner: a registered name (``final``, ``discounted``, ``intermediate``, ``air`` or a
    plugin's) or a :class:`~agentbolt.lightningrl.CreditAssigner` instance."""
    credit_options: dict[str, Any] = Field(default_factory=dict)
    """Keyword options of a credit assigner given by name (e.g. ``{"gamma": 0.9}`` for ``discounted``)."""
    advantage: str | AdvantageEstimator = "grpo"
    """Advantage estimator: a registered name (``grpo``, ``rloo``, ``reinforce_pp`` or a plugin's)
    or an :class:`~agentbolt.lightningrl.AdvantageEstimator` instance. Rollouts are grouped by
    ``Rollout.group_id``."""
    advantage_options: dict[str, Any] = Field(default_factory=dict)
    """Keyword options of an estimator given by name: ``level`` (``"rollout"``, the default: each
    rollout counts once in its group; ``"transition"``: each call is a sample), ``norm_std``
    (GRPO; ``False`` is Dr.GRPO), ``whiten`` (REINFORCE++), ``epsilon``."""
    agent_match: Any = None
    """Selective optimization: which agents are trained: ``None`` (all), a regex searched in the
    agent name, a collection of exact names, or a predicate on the name."""
    merge: bool = False
    """Merge consecutive calls whose prompts extend each other into one masked sequence."""
    allow_retokenized: bool = False
    """Train on calls whose token ids were rebuilt from text instead of reported by the backend."""
    max_prompt_length: int | None = Field(default=None, gt=0)
    """Leave calls with longer prompts out (``None``: no limit)."""
    max_response_length: int | None = Field(default=None, gt=0)
    """Leave calls with longer responses out (``None``: no limit)."""
    max_length: int | None = Field(default=None, gt=0)
    """Leave calls longer than this (prompt + response) out; also bounds merged sequences."""
    missing_reward: Literal["drop", "fill"] = "drop"
    """A rollout without an episode return: ``drop`` its calls (reported as ``missing_reward``) or
    ``fill`` the return with ``fill_value``. Never a silent 0."""
    fill_value: float | None = None
    """The return used by ``missing_reward="fill"`` (required then)."""
    promote_trailing_reward: bool = True
    """Without a final reward, use the last untargeted reward after the last call as the return."""
    unreconciled: Literal["exclude", "train"] = "exclude"
    """A rollout flagged by reconciliation (an instrumentation LLM span with a response joined no
    gateway call: a call the gateway did not see, or a failed join): ``exclude`` its calls (reason
    ``unreconciled``, reported) or ``train`` them anyway (the flag is still reported)."""
    allow_empty: bool = False
    """Return an empty batch instead of raising :class:`~agentbolt.lightningrl.EmptyBatchError`."""
    loss_aggregation: LossAggregation = DEFAULT_LOSS_AGGREGATION
    """How per-token losses become one number: ``rollout-mean-token-mean`` (each rollout weighs
    the same), ``token-mean`` (each token), ``seq-mean-token-mean`` (each call, tokens averaged
    inside it) or ``seq-mean-token-sum`` (each call, tokens summed)."""

    max_staleness: int | None = Field(default=None, ge=0)
    """Off-policy bound: calls sampled by a policy version more than this many versions older than
    the one being trained are left out (reason ``stale``, counted), as are calls without a
    recorded version; ``0`` is on-policy only, ``None`` no bound. Needs the trained version:
    ``LightningRL.process(..., policy_version=)``."""
    rollout_is: Literal["token", "sequence"] | None = None
    """Importance sampling between the sampling (behaviour) and the trained (proximal) policy,
    verl's ``rollout_is``: ``token`` (token TIS), ``sequence`` (sequence TIS) or ``None``. Calls
    without sampling logprobs are left out (reason ``no_logprobs``)."""
    rollout_is_threshold: float | str = 2.0
    """The TIS cap (verl's ``rollout_is_threshold``), or ``"lower_upper"`` (IcePop: weights outside
    the bounds become 0)."""
    rollout_is_batch_normalize: bool = False
    """Normalize the IS weights to mean 1 over the batch (verl's ``rollout_is_batch_normalize``)."""
    rollout_rs: str | None = None
    """Rejection (masking) of tokens or rows whose divergence is out of bounds, verl's
    ``rollout_rs``: e.g. ``seq_sum_k1`` (sequence MIS), ``seq_mean_k3``, ``token_k1``; several
    comma-separated options must all pass. Calls without sampling logprobs are left out."""
    rollout_rs_threshold: float | str | None = None
    """Bounds of ``rollout_rs`` (verl's ``rollout_rs_threshold``): ``"lower_upper"`` ratio bounds
    for ``*_k1`` options (one ``T`` means ``1/T`` to ``T``), an upper bound for ``k2``/``k3``."""

    @field_validator("agent_match")
    @classmethod
    def _valid_agent_match(cls, value: Any) -> Any:
        agent_selector(value)  # raises UserError on an invalid regex
        if isinstance(value, list | set | frozenset):
            return tuple(value)  # hashable, like the rest of a frozen config
        return value

    @model_validator(mode="after")
    def _consistent(self) -> LightningRLConfig:
        if self.missing_reward == "fill" and self.fill_value is None:
            raise ValueError(
                "missing_reward='fill' needs an explicit fill_value (missing rewards are never silently 0)"
            )
        if self.credit_options and not isinstance(self.credit, str):
            raise ValueError("credit_options apply to a credit assigner given by name, not to an instance")
        if self.advantage_options and not isinstance(self.advantage, str):
            raise ValueError("advantage_options apply to an estimator given by name, not to an instance")
        try:
            self._correction()
        except UserError as exc:
            raise ValueError(str(exc)) from None
        return self

    def _correction(self) -> RolloutCorrection:
        return RolloutCorrection(
            rollout_is=self.rollout_is,
            rollout_is_threshold=self.rollout_is_threshold,
            rollout_is_batch_normalize=self.rollout_is_batch_normalize,
            rollout_rs=self.rollout_rs,
            rollout_rs_threshold=self.rollout_rs_threshold,
        )

    @property
    def correction(self) -> RolloutCorrection | None:
        """The off-policy correction (``rollout_is`` / ``rollout_rs``), or ``None`` when neither is set."""
        correction = self._correction()
        return correction if correction.enabled else None

    @classmethod
    def from_value(
        cls, value: LightningRLConfig | Mapping[str, Any] | None = None, /, **overrides: Any
    ) -> LightningRLConfig:
        """A config from a config, a mapping of its fields or ``None`` (the defaults), with
        ``overrides`` (field names) applied on top. Raises :class:`UserError` naming what is wrong."""
        if value is None:
            fields: dict[str, Any] = {}
        elif isinstance(value, LightningRLConfig):
            if not overrides:
                return value
            fields = {name: getattr(value, name) for name in type(value).model_fields}
        elif isinstance(value, Mapping):
            fields = dict(value)
        else:
            raise UserError(f"expected a LightningRLConfig or a mapping of its fields, got {type(value).__name__}")
        try:
            return cls(**{**fields, **overrides})
        except ValidationError as exc:
            unknown = f"unknown field; valid fields: {', '.join(LightningRLConfig.model_fields)}"
            raise UserError(invalid_fields_message("invalid LightningRLConfig", exc, unknown=unknown)) from None

    def replace(self, **overrides: Any) -> LightningRLConfig:
        """A copy with ``overrides`` applied (validated)."""
        return LightningRLConfig.from_value(self, **overrides)

    def as_record(self) -> dict[str, Any]:
        """The fields as JSON-compatible values (instances and predicates as their ``repr``), as
        runs record them."""
        out: dict[str, Any] = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, tuple):
                value = list(value)
            out[name] = value if _jsonable(value) else repr(value)
        return out


def _jsonable(value: Any) -> bool:
    if value is None or isinstance(value, str | int | float | bool):
        return True
    if isinstance(value, list):
        return all(_jsonable(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _jsonable(v) for k, v in value.items())
    return False
