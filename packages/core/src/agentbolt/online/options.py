"""The option groups of ``agentbolt serve`` (:class:`~agentbolt.online.serve.OnlineServer`).

    OnlineServer(
        store="sqlite:///serve.db",
        policy=my_policy,
        sessions=SessionOptions(idle_s=120),
        updates=UpdateOptions(min_sessions=32, grouping="prompt"),
        gate=GateOptions(agent=my_agent, tasks=held_out, samples=2),
        judge=JudgeOptions(judge=LLMJudge(url, "judge-model"), after_s=600),
    )

A mapping of the fields works wherever an options object does; a wrong field is a
:class:`~agentbolt.errors.UserError` naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Self

from pydantic import ConfigDict, Field, field_validator

from ..lightningrl.config import LightningRLConfig
from ..options import OptionGroup
from .grouping import Grouping

__all__ = ["GateOptions", "JudgeOptions", "SessionOptions", "UpdateOptions", "online_lightningrl"]


def online_lightningrl() -> LightningRLConfig:
    """The default LightningRL choices online: a session's final reward for every call plus
    per-response feedback on its call (``intermediate``), GRPO over the update's groups,
    sessions without a final reward dropped (and reported)."""
    return LightningRLConfig(credit="intermediate", advantage="grpo", allow_empty=True)


class _Group(OptionGroup):
    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True, use_attribute_docstrings=True)

    @classmethod
    def from_value(cls, value: Self | Mapping[str, Any] | None, /, *, option: str) -> Self | None:
        """The options from an instance, a mapping of its fields, or ``None``."""
        return None if value is None else cls.coerce(value, option=option)


class SessionOptions(_Group):
    """How live calls are grouped into sessions (:mod:`agentbolt.online.sessions`)."""

    idle_s: float = Field(default=300.0, gt=0)
    """A session with no call for this long is closed (and can be trained once rewarded)."""
    lease_s: float = Field(default=3600.0, gt=0)
    """Store lease of an open session; a serve process down longer loses its open sessions'
    attempts (their calls and rewards are kept and trained as closed sessions)."""
    retention_s: float = Field(default=30 * 86400.0, gt=0)
    """Sessions older than this are forgotten at start (feedback for them is refused)."""


class UpdateOptions(_Group):
    """When and how the background training runs (:mod:`agentbolt.online.training`)."""

    min_sessions: int = Field(default=32, ge=1)
    """An update starts once this many closed, rewarded, untrained sessions wait."""
    max_sessions: int = Field(default=256, ge=1)
    """At most this many sessions (oldest first) per update."""
    grouping: Grouping = "auto"
    """How sessions form advantage groups: ``auto``, ``task_key``, ``prompt`` or ``batch``
    (:mod:`agentbolt.online.grouping`)."""
    min_group: int = Field(default=2, ge=2)
    """``auto``: a prompt group needs this many sessions, else they join the batch group."""
    check_every_s: float = Field(default=5.0, gt=0)
    """How often the trainer looks for enough rewarded sessions."""
    lightningrl: LightningRLConfig = Field(default_factory=online_lightningrl)
    """Credit, advantages, staleness bound, ...: LightningRL as everywhere."""
    drain_timeout_s: float = Field(default=60.0, gt=0)
    """Longest wait for the former live slot's calls to finish after a swap."""
    keep_versions: int = Field(default=2, ge=1)
    """Live checkpoints kept on disk (the newest)."""

    @field_validator("lightningrl", mode="before")
    @classmethod
    def _config(cls, value: Any) -> LightningRLConfig:
        return LightningRLConfig.from_value(value)


class GateOptions(_Group):
    """The held-out gate (:mod:`agentbolt.online.gate`)."""

    agent: Any
    """The agent run on the held-out tasks: ``(task, resources) -> reward`` or ``"module:attr"``."""
    tasks: list[Any] = Field(min_length=1)
    """The held-out tasks (dataset items); never trained on (overlapping sessions are left out)."""
    samples: int = Field(default=1, ge=1)
    """Rollouts per task and version."""
    z: float = Field(default=2.0, ge=0)
    """How many standard errors of the paired difference a candidate may lose."""
    tolerance: float = Field(default=0.0, ge=0)
    """Further loss allowed, in reward units."""
    max_failed: float = Field(default=0.5, ge=0, le=1)
    """Share of evaluation rollouts that may fail before the gate refuses to decide."""
    sampling: dict[str, Any] = Field(default_factory=dict)
    """Sampling forced on evaluation calls (e.g. ``{"temperature": 0}``)."""
    concurrency: int = Field(default=8, ge=1)
    """Evaluation rollouts at once."""
    timeout_s: float | None = Field(default=300.0, gt=0)
    """Limit of one evaluation rollout."""


class JudgeOptions(_Group):
    """Scoring sessions nobody rated (:mod:`agentbolt.online.judging`)."""

    judge: Any
    """An :class:`~agentbolt.rewards.LLMJudge`."""
    after_s: float = Field(default=3600.0, ge=0)
    """A closed session without a final reward is judged this long after it closed."""
    mode: Literal["rubric", "ranking"] = "rubric"
    """``rubric``: each session on its own; ``ranking``: pending sessions of a group together."""
    max_tries: int = Field(default=3, ge=1)
    """Sweeps that may try a session before it is left unscored."""
    every_s: float = Field(default=5.0, gt=0)
    """How often pending sessions are looked for."""
