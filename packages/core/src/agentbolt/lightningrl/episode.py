"""What an episode is: a rollout's final attempt as LLM calls and rewards (the data model).

:class:`Episode` holds every :class:`LLMCall` of the attempt in ``seq`` order (trainable or
excluded, with an :class:`ExclusionReason`) and every reward span as a :class:`RewardRecord`
with its attachment; credit assigners read it. :data:`AgentMatch` and :func:`agent_selector`
say which agents are trained.

How an episode is built from spans, and the rules it follows (which spans count, how gateway
and framework spans join into one call, exclusions, where rewards attach), is
:mod:`agentbolt.lightningrl.extraction` (:func:`~agentbolt.lightningrl.extraction.extract_episode`).
"""

from __future__ import annotations

import enum
import re
from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Literal, TypeAlias

from ..errors import UserError
from ..types import Rollout, Span, TokenSource
from . import spans as sp

__all__ = [
    "AgentMatch",
    "Episode",
    "ExclusionReason",
    "LLMCall",
    "Reconciliation",
    "RewardAttachment",
    "RewardRecord",
    "agent_selector",
]

AgentMatch: TypeAlias = str | re.Pattern[str] | Iterable[str] | Callable[[str | None], bool] | None
"""Which agents are trained: ``None`` (all), a regex searched in the agent name (``"write"``
matches ``write_query`` and ``rewrite_query``; anchor it for exact names), a collection of exact
names, or a predicate on the name (which may be ``None``)."""


class ExclusionReason(enum.StrEnum):
    """Why an LLM call produced no transition."""

    AGENT_NOT_SELECTED = "agent_not_selected"
    """``agent_match`` does not select the call's agent (or the call has no agent name)."""
    FAILED_CALL = "failed_call"
    """The gateway recorded the call as failed (status ERROR): nothing was generated."""
    NO_TOKEN_IDS = "no_token_ids"
    """No token ids: ``token_source=missing``, ids absent, or no gateway span for the call."""
    MALFORMED = "malformed"
    """Token data present but unusable (non-integer ids, logprobs of the wrong length)."""
    RETOKENIZED = "retokenized"
    """Ids were reconstructed by tokenizing text, and ``allow_retokenized`` is off."""
    TOKEN_DRIFT = "token_drift"
    """Retokenized ids disagree with what the backend reported (``agentbolt.llm.token_drift``)."""
    EMPTY_RESPONSE = "empty_response"
    """The response has no tokens."""
    OVER_LENGTH = "over_length"
    """Prompt, response or total length exceeds the configured maximum."""
    MISSING_REWARD = "missing_reward"
    """The rollout has no episode return and the missing-reward policy is ``drop``."""
    STALE = "stale"
    """Sampled by a policy version more than ``max_staleness`` versions older than the one being
    trained (or by an unrecorded version while ``max_staleness`` is set)."""
    NO_LOGPROBS = "no_logprobs"
    """No sampling logprobs, and off-policy correction (``rollout_is`` / ``rollout_rs``) needs them."""
    NO_POLICY = "no_policy"
    """With policies by role (:mod:`agentbolt.policies`): no policy's ``match`` selects the call's agent."""
    UNRECONCILED = "unreconciled"
    """The rollout is flagged: its framework spans and its gateway calls disagree (an
    instrumentation LLM span with a response joined no gateway call: a call that bypassed the
    gateway, or a join that failed). See :class:`Reconciliation`."""
    POLICY_MISMATCH = "policy_mismatch"
    """With policies by role: the call was served by another policy (or the base model) than its
    agent's, e.g. because the gateway could not name the agent when the call was made."""


RewardAttachment: TypeAlias = Literal["final", "target_span", "target_response", "preceding", "unattached", "malformed"]


@dataclass(frozen=True, eq=False)
class LLMCall:
    """One LLM call of an episode (trainable or not)."""

    index: int
    """Position among all calls of the episode (0-based, ``seq`` order)."""
    position: int
    """Position of the call's ordering span among the episode's spans (ordering key)."""
    gateway_span: Span | None
    """The gateway's LLM-call span (token data), if the call went through the gateway."""
    framework_spans: tuple[Span, ...]
    """Adapter / GenAI instrumentation LLM spans joined to this call."""
    agent_name: str | None
    """Agent that made the call."""
    response_id: str | None
    """``gen_ai.response.id``."""
    prompt_ids: list[int] | None
    """Prompt token ids, when recorded."""
    response_ids: list[int] | None
    """Response token ids, when recorded."""
    response_logprobs: list[float] | None
    """Logprob of each response token, when recorded."""
    token_source: TokenSource
    """How the ids were obtained (``missing`` without a gateway span)."""
    policy_version: int | None
    """Policy (resources) version that served the call."""
    finish_reason: str | None
    """First entry of ``gen_ai.response.finish_reasons``."""
    exclusion: ExclusionReason | None = None
    """Why the call produces no transition; ``None`` for a trainable call."""
    exclusion_detail: str | None = None
    """Human-readable detail of the exclusion."""
    policy_name: str | None = None
    """With policies by role: the policy that served the call (``None``: the base model, or one
    shared policy)."""

    @property
    def trainable(self) -> bool:
        """True when the call becomes a transition."""
        return self.exclusion is None

    @property
    def span_id(self) -> str:
        """The gateway span id, else the first framework span id."""
        if self.gateway_span is not None:
            return self.gateway_span.span_id
        return self.framework_spans[0].span_id

    @property
    def span_ids(self) -> tuple[str, ...]:
        """Ids of every span that forms this call."""
        head = (self.gateway_span.span_id,) if self.gateway_span is not None else ()
        return head + tuple(s.span_id for s in self.framework_spans)

    @property
    def seq(self) -> int | None:
        """``seq`` of the call's ordering span."""
        span = self.gateway_span if self.gateway_span is not None else self.framework_spans[0]
        return span.seq

    @cached_property
    def response_text(self) -> str | None:
        """Generated text (see :func:`agentbolt.lightningrl.spans.response_text`)."""
        return sp.response_text(self.gateway_span, self.framework_spans)

    @cached_property
    def tool_call_ids(self) -> tuple[str, ...]:
        """Ids of the tool calls this call's response requested."""
        return tuple(sp.tool_call_ids(self.gateway_span, self.framework_spans))


@dataclass(frozen=True)
class Reconciliation:
    """How a rollout's framework LLM spans reconciled with its gateway calls.

    The gateway's LLM-call spans are the ground truth of what the model did: when a rollout has
    any, LightningRL's calls are exactly its gateway calls, and a framework / instrumentation LLM
    span that joins none is an operation span (counted here), never a call. Such a span that
    carries a response (a response id, output messages or output tokens) is evidence of a model
    call the gateway did not see, or of a join that failed: the rollout is flagged (:attr:`flag`)
    and, by default, not trained (``unreconciled``)."""

    gateway_calls: int
    """Gateway LLM-call spans of the attempt."""
    calls: int
    """LightningRL calls (equal to :attr:`gateway_calls` when the rollout has any gateway call;
    without one, the framework LLM spans: the ids-less path)."""
    joined_framework_spans: int = 0
    """Framework LLM spans joined to a gateway call (nested ones included)."""
    unjoined_llm_spans: int = 0
    """Framework LLM spans that joined no gateway call (operations; no call)."""
    unjoined_with_response: int = 0
    """Of those, the outermost ones that carry a response: a model call the gateway did not see."""
    flag: str | None = None
    """Why the rollout is flagged, with what to do; ``None`` when it reconciles."""

    @property
    def ok(self) -> bool:
        """True when the rollout reconciles (no flag)."""
        return self.flag is None


@dataclass(frozen=True)
class RewardRecord:
    """One reward span and where it attached."""

    span_id: str
    """The reward span."""
    position: int
    """Position among the episode's spans."""
    value: float | None
    """Primary value; ``None`` when malformed."""
    is_final: bool
    """Flagged ``agentbolt.reward.final``."""
    attachment: RewardAttachment
    """``final`` (the episode return), ``target_span`` / ``target_response`` (explicit target),
    ``preceding`` (latest call before it), ``unattached`` or ``malformed``."""
    call_index: int | None = None
    """Index of the call an intermediate reward attached to."""
    name: str | None = None
    """``agentbolt.reward.primary``."""
    dimensions: Mapping[str, float] = field(default_factory=dict)
    """All named reward dimensions."""
    target: str | None = None
    """The explicit target (span id or response id) it named, if any."""
    detail: str | None = None
    """Why a reward is unattached, malformed or superseded."""


@dataclass(frozen=True, eq=False)
class Episode:
    """A rollout's final attempt seen as an RL episode: its LLM calls (in ``seq`` order) and rewards.

    Credit assigners read it; :func:`~agentbolt.lightningrl.extraction.extract_episode` builds it.
    """

    rollout: Rollout
    """The rollout."""
    attempt_id: str | None
    """The attempt whose spans were used."""
    spans: tuple[Span, ...]
    """The spans considered, in ``seq`` order."""
    calls: tuple[LLMCall, ...]
    """Every LLM call, trainable or not, in ``seq`` order (``calls[i].index == i``)."""
    rewards: tuple[RewardRecord, ...]
    """Every reward span, in ``seq`` order, with its attachment."""
    final_reward: float | None
    """The episode return R; ``None`` when missing."""
    final_source: Literal["span", "rollout", "trailing_reward", "filled"] | None
    """Where R came from: a final reward span, ``Rollout.final_reward``, a promoted trailing
    reward, or the missing-reward fill value."""
    notes: Mapping[str, int] = field(default_factory=dict)
    """Counters of what extraction noticed (spans of other attempts, joins, malformed rewards...)."""
    reconciliation: Reconciliation | None = None
    """Gateway calls vs framework LLM spans (``None`` for episodes built by hand)."""

    @property
    def rollout_id(self) -> str:
        """The rollout's id."""
        return self.rollout.rollout_id

    @cached_property
    def step_rewards(self) -> tuple[float, ...]:
        """r_i: the sum of the intermediate rewards attached to each call (0.0 where none)."""
        out = [0.0] * len(self.calls)
        for rec in self.rewards:
            if rec.call_index is not None and rec.value is not None:
                out[rec.call_index] += rec.value
        return tuple(out)

    @cached_property
    def span_by_id(self) -> dict[str, Span]:
        """The episode's spans by id."""
        return {s.span_id: s for s in self.spans}

    @cached_property
    def _call_of_member(self) -> dict[str, int]:
        return {sid: c.index for c in self.calls for sid in c.span_ids}

    @cached_property
    def _positions(self) -> list[int]:
        return [c.position for c in self.calls]

    @cached_property
    def _position_of_span(self) -> dict[str, int]:
        return {s.span_id: i for i, s in enumerate(self.spans)}

    @cached_property
    def _call_of_tool_call_id(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for call in self.calls:
            for tid in call.tool_call_ids:
                out.setdefault(tid, call.index)
        return out

    def position_of(self, span: Span) -> int:
        """Ordering position of one of the episode's spans."""
        return self._position_of_span[span.span_id]

    def call_of_span(self, span_id: str) -> int | None:
        """Index of the call that ``span_id`` (a gateway or joined framework span) belongs to."""
        return self._call_of_member.get(span_id)

    def enclosing_call(self, span: Span) -> int | None:
        """Index of the call whose span is an ancestor of ``span`` (e.g. an exception raised
        inside an LLM call span)."""
        for parent in sp.ancestors(span, self.span_by_id):
            index = self._call_of_member.get(parent.span_id)
            if index is not None:
                return index
        return None

    def preceding_call(self, position: int) -> int | None:
        """Index of the latest call strictly before ``position`` in ``seq`` order."""
        i = bisect_left(self._positions, position)
        return i - 1 if i > 0 else None

    def call_for_tool_call_id(self, tool_call_id: str) -> int | None:
        """Index of the call whose response requested the tool call ``tool_call_id``."""
        return self._call_of_tool_call_id.get(tool_call_id)

    @property
    def trainable_calls(self) -> list[LLMCall]:
        """The calls that become transitions."""
        return [c for c in self.calls if c.trainable]

    def with_final_reward(self, value: float, source: Literal["filled"] = "filled") -> Episode:
        """A copy with the episode return set (the missing-reward fill)."""
        return replace(self, final_reward=float(value), final_source=source)

    def with_call_exclusions(self, exclusions: Mapping[int, tuple[ExclusionReason, str | None]]) -> Episode:
        """A copy in which the calls at the given indices are excluded (reason, detail)."""
        calls = tuple(
            replace(c, exclusion=exclusions[c.index][0], exclusion_detail=exclusions[c.index][1])
            if c.index in exclusions
            else c
            for c in self.calls
        )
        return replace(self, calls=calls)

    def with_exclusion(self, reason: ExclusionReason, detail: str | None = None) -> Episode:
        """A copy in which every trainable call is excluded for ``reason``."""
        calls = tuple(
            c if not c.trainable else replace(c, exclusion=reason, exclusion_detail=detail) for c in self.calls
        )
        return replace(self, calls=calls)


# --- agent selection ---------------------------------------------------------------------------


def agent_selector(agent_match: AgentMatch) -> Callable[[str | None], bool]:
    """A predicate from an :data:`AgentMatch` (see there for the forms accepted)."""
    if agent_match is None:
        return lambda name: True
    if isinstance(agent_match, str | re.Pattern):
        try:
            pattern = re.compile(agent_match)
        except re.error as exc:
            raise UserError(f"agent_match {agent_match!r} is not a valid regular expression: {exc}") from exc
        return lambda name: name is not None and pattern.search(name) is not None
    if callable(agent_match):
        return agent_match
    names = frozenset(agent_match)
    if not all(isinstance(n, str) for n in names):
        raise UserError(f"agent_match must hold agent names (str), got {sorted(map(repr, names))}")
    return lambda name: name in names
