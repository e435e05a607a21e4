"""Extraction: the spans of a rollout's final attempt → an :class:`Episode` of LLM calls and rewards.

Rules (all ordering is by the store-assigned ``seq``, never by clocks):

**Spans considered.** Spans of the rollout whose ``attempt_id`` is the rollout's final attempt
(``Rollout.current_attempt_id``, else the attempt of the latest span) or ``None`` (records
written outside an attempt, such as a runner's final reward). Others are counted in
``Episode.notes["spans_other_attempts"]``.

**Calls.** Every gateway LLM-call span is one call. A framework LLM span (adapter or GenAI
instrumentation) joins the gateway call with the same ``gen_ai.response.id``, or the gateway
call it is an ancestor of (W3C traceparent propagated); framework LLM spans nested in
another framework LLM span belong to the outermost one. Joined spans are one call (never
counted twice). A framework LLM span that joins no gateway call is still a call, one with no
token ids (excluded, reported). A call's position is its gateway span's ``seq`` (the framework
span's own ``seq`` when there is no gateway span).

**Agent name.** ``gen_ai.agent.name`` of the nearest enclosing agent span (via
``parent_span_id`` chains of the call's framework spans, then of its gateway span), else the
call's own ``gen_ai.agent.name`` attribute, else ``None``.

**Exclusions** (first that applies, in this order): ``agent_not_selected`` (``agent_match``
rejects the agent), ``failed_call`` (gateway span status ERROR), ``no_token_ids``
(``token_source=missing``, ids absent, or no gateway span), ``malformed`` (ids not integer
lists, logprobs length ≠ response length), ``retokenized`` (unless allowed),
``empty_response``, ``over_length`` (prompt/response/total over the configured maximum).
Excluded calls stay in the episode (credit is computed over every call), only their
transitions are not produced.

**Rewards.** A reward span (``agentbolt.reward`` / kind ``reward``) has value
``agentbolt.reward.value`` (else ``dimensions[primary]``); one without a finite value is
``malformed`` and ignored (reported). With ``agentbolt.reward.final = true`` it is a final
reward: the last one in ``seq`` is the episode return. A non-final reward is intermediate and
attaches to: the call owning ``agentbolt.reward.target_span_id`` (a gateway or joined framework
span id), else the call with ``gen_ai.response.id == agentbolt.reward.target_response_id``,
else the latest call before it in ``seq``. An explicit target that matches no call, or an
untargeted reward before any call, stays unattached (reported, never moved elsewhere).
Without a final reward span the episode return is ``Rollout.final_reward``; without either,
(``promote_trailing_reward``) the last untargeted reward after the last call is promoted to the
episode return (the v0 behaviour of "the last reward is the final one"); otherwise the
return is missing (``None``) and the caller's missing-reward policy decides.
"""

from __future__ import annotations

import enum
import math
import re
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Literal, TypeAlias

from .. import semconv
from ..errors import UserError
from ..types import Rollout, Span, StatusCode, TokenSource
from . import spans as sp

__all__ = [
    "AgentMatch",
    "Episode",
    "ExclusionReason",
    "LLMCall",
    "RewardRecord",
    "agent_selector",
    "extract_episode",
    "final_attempt_spans",
    "order_spans",
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


RewardAttachment = Literal["final", "target_span", "target_response", "preceding", "unattached", "malformed"]


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

    Credit assigners read it; :func:`extract_episode` builds it.
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
        return agent_match  # type: ignore[return-value]
    names = frozenset(agent_match)
    if not all(isinstance(n, str) for n in names):
        raise UserError(f"agent_match must hold agent names (str), got {sorted(map(repr, names))}")
    return lambda name: name in names


# --- ordering and attempts ---------------------------------------------------------------------


def final_attempt_spans(rollout: Rollout, spans: Sequence[Span]) -> tuple[str | None, list[Span], int]:
    """(attempt id, spans of that attempt or of no attempt, number of other spans dropped).

    The attempt is ``rollout.current_attempt_id``, else the attempt of the span with the
    highest ``seq``.
    """
    attempt = rollout.current_attempt_id
    if attempt is None:
        with_attempt = [s for s in spans if s.attempt_id is not None]
        if with_attempt:
            attempt = max(with_attempt, key=lambda s: -1 if s.seq is None else s.seq).attempt_id
    kept = [s for s in spans if s.attempt_id is None or s.attempt_id == attempt]
    return attempt, kept, len(spans) - len(kept)


def order_spans(spans: Sequence[Span]) -> list[Span]:
    """Spans in store ``seq`` order (stable); spans not yet stored (``seq=None``) follow in the
    order given. Duplicate span ids keep their first occurrence."""
    seen: set[str] = set()
    unique = []
    for s in spans:
        if s.span_id not in seen:
            seen.add(s.span_id)
            unique.append(s)
    return sorted(unique, key=lambda s: (s.seq is None, s.seq if s.seq is not None else 0))


# --- extraction --------------------------------------------------------------------------------


def extract_episode(
    rollout: Rollout,
    spans: Sequence[Span],
    *,
    agent_match: AgentMatch = None,
    allow_retokenized: bool = False,
    max_prompt_length: int | None = None,
    max_response_length: int | None = None,
    max_length: int | None = None,
    promote_trailing_reward: bool = True,
) -> Episode:
    """Build the :class:`Episode` of one rollout from its spans (rules in the module docstring).

    Args:
        rollout: the rollout (its ``current_attempt_id`` picks the attempt).
        spans: the rollout's spans, e.g. ``store.query_spans([id], latest_attempt_only=True)[id]``.
        agent_match: which agents are trained (:data:`AgentMatch`).
        allow_retokenized: train on calls whose ids were retokenized.
        max_prompt_length, max_response_length, max_length: exclude longer calls (``over_length``).
        promote_trailing_reward: without any final reward, use the last untargeted reward after
            the last call as the episode return.
    """
    select = agent_selector(agent_match)
    notes: Counter[str] = Counter()
    own = [s for s in spans if s.rollout_id is None or s.rollout_id == rollout.rollout_id]
    if len(own) < len(spans):
        notes["spans_other_rollouts"] += len(spans) - len(own)
    attempt_id, kept, dropped = final_attempt_spans(rollout, own)
    if dropped:
        notes["spans_other_attempts"] += dropped
    ordered = order_spans(kept)
    if len(ordered) < len(kept):
        notes["duplicate_spans"] += len(kept) - len(ordered)
    unsequenced = sum(1 for s in ordered if s.seq is None)
    if unsequenced:
        notes["unsequenced_spans"] += unsequenced
    by_id = {s.span_id: s for s in ordered}
    position = {s.span_id: i for i, s in enumerate(ordered)}

    raw_calls = _group_calls(ordered, by_id, position, notes)
    calls: list[LLMCall] = []
    limits = (max_prompt_length, max_response_length, max_length)
    for index, (pos, gateway, framework) in enumerate(raw_calls):
        call = _make_call(index, pos, gateway, framework, by_id, rollout)
        reason, detail = _exclusion(call, select, allow_retokenized, limits)
        if reason is not None:
            call = replace(call, exclusion=reason, exclusion_detail=detail)
        calls.append(call)

    rewards, final, source = _attach_rewards(rollout, ordered, calls, notes, promote_trailing_reward)
    return Episode(
        rollout=rollout,
        attempt_id=attempt_id,
        spans=tuple(ordered),
        calls=tuple(calls),
        rewards=tuple(rewards),
        final_reward=final,
        final_source=source,
        notes={k: v for k, v in notes.items() if v},
    )


def _group_calls(
    ordered: list[Span], by_id: dict[str, Span], position: dict[str, int], notes: Counter[str]
) -> list[tuple[int, Span | None, tuple[Span, ...]]]:
    """(position, gateway span, framework spans) of every call, in position order."""
    framework = [s for s in ordered if sp.is_framework_llm_span(s)]
    fw_ids = {s.span_id for s in framework}
    cluster_of: dict[str, str] = {}
    clusters: dict[str, list[Span]] = {}
    for s in framework:
        root = s.span_id
        for parent in sp.ancestors(s, by_id):
            if parent.span_id in fw_ids:
                root = parent.span_id
        cluster_of[s.span_id] = root
        clusters.setdefault(root, []).append(s)
    if len(clusters) < len(framework):
        notes["nested_framework_llm_spans"] += len(framework) - len(clusters)

    # Response id -> clusters (in order); several clusters share an id only with broken backends.
    by_response: dict[str, list[str]] = {}
    for root, members in clusters.items():
        for rid in dict.fromkeys(_response_id(m) for m in members):
            if rid is not None:
                by_response.setdefault(rid, []).append(root)

    gateways = [s for s in ordered if sp.is_gateway_call(s)]
    gw_by_response: dict[str, list[Span]] = {}
    for g in gateways:
        rid = _response_id(g)
        if rid is not None and rid in by_response:
            gw_by_response.setdefault(rid, []).append(g)
    joined: dict[str, str] = {}  # gateway span id -> cluster root
    for rid, gws in gw_by_response.items():
        roots = by_response[rid]
        for i, g in enumerate(gws):  # pair in order; extra gateway spans (n > 1 choices) join the last
            joined[g.span_id] = roots[min(i, len(roots) - 1)]
            notes["joined_by_response_id"] += 1
    for g in gateways:
        if g.span_id in joined:
            continue
        for parent in sp.ancestors(g, by_id):
            if parent.span_id in cluster_of:
                joined[g.span_id] = cluster_of[parent.span_id]
                notes["joined_by_parent"] += 1
                break
    # Last resort, for framework LLM spans that carry no response id at all (e.g. streamed calls
    # through langchain-openai): pair the remaining gateway calls and such spans by their order,
    # each list by its own start times, only when the counts match. Counted in the report.
    used_roots = set(joined.values())
    open_gateways = sorted((g for g in gateways if g.span_id not in joined), key=lambda g: g.start_time_ns)
    anonymous = sorted(
        (
            root
            for root, members in clusters.items()
            if root not in used_roots and all(_response_id(m) is None for m in members)
        ),
        key=lambda root: min(m.start_time_ns for m in clusters[root]),
    )
    if open_gateways and len(open_gateways) == len(anonymous):
        for g, root in zip(open_gateways, anonymous, strict=True):
            joined[g.span_id] = root
            notes["joined_by_order"] += 1
    elif open_gateways and anonymous:
        notes["unjoined_without_response_id"] += len(anonymous)

    out: list[tuple[int, Span | None, tuple[Span, ...]]] = [
        (position[g.span_id], g, tuple(clusters[joined[g.span_id]]) if g.span_id in joined else ()) for g in gateways
    ]
    used = set(joined.values())
    for root, members in clusters.items():
        if root not in used:
            out.append((min(position[m.span_id] for m in members), None, tuple(members)))
    out.sort(key=lambda c: c[0])
    return out


def _response_id(span: Span) -> str | None:
    rid = span.attributes.get(semconv.GEN_AI_RESPONSE_ID)
    return rid if isinstance(rid, str) and rid else None


def _agent_name(gateway: Span | None, framework: tuple[Span, ...], by_id: Mapping[str, Span]) -> str | None:
    chain = (*framework, gateway) if gateway is not None else framework
    for span in chain:
        for parent in sp.ancestors(span, by_id):
            if sp.is_agent_span(parent):
                return sp.agent_name_of(parent)
    for span in (gateway, *framework) if gateway is not None else framework:
        name = span.attributes.get(semconv.GEN_AI_AGENT_NAME)
        if isinstance(name, str) and name:
            return name
    return None


def _int_list(value: Any) -> list[int] | None:
    """``value`` if it is a list of ints (span attributes are validated homogeneous lists, so the
    first element's type is the list's)."""
    if isinstance(value, list) and (not value or type(value[0]) is int):
        return value
    return None


def _make_call(
    index: int,
    pos: int,
    gateway: Span | None,
    framework: tuple[Span, ...],
    by_id: Mapping[str, Span],
    rollout: Rollout,
) -> LLMCall:
    agent = _agent_name(gateway, framework, by_id)
    response_id = None
    for s in (gateway, *framework):
        if s is not None and (response_id := _response_id(s)) is not None:
            break
    if gateway is None:
        return LLMCall(
            index=index,
            position=pos,
            gateway_span=None,
            framework_spans=framework,
            agent_name=agent,
            response_id=response_id,
            prompt_ids=None,
            response_ids=None,
            response_logprobs=None,
            token_source=TokenSource.MISSING,
            policy_version=rollout.resources_version,
            finish_reason=_finish_reason(framework[0]),
        )
    attrs = gateway.attributes
    prompt, response = attrs.get(semconv.PROMPT_TOKEN_IDS), attrs.get(semconv.RESPONSE_TOKEN_IDS)
    logprobs = attrs.get(semconv.RESPONSE_LOGPROBS)
    raw_source = attrs.get(semconv.TOKEN_SOURCE)
    if raw_source is None:  # not written by our gateway: ids present count as exact
        source = TokenSource.EXACT if prompt is not None and response is not None else TokenSource.MISSING
    else:
        try:
            source = TokenSource(raw_source)
        except ValueError:
            source = TokenSource.MISSING
    version = attrs.get(semconv.POLICY_VERSION)
    return LLMCall(
        index=index,
        position=pos,
        gateway_span=gateway,
        framework_spans=framework,
        agent_name=agent,
        response_id=response_id,
        prompt_ids=prompt if isinstance(prompt, list) else None,
        response_ids=response if isinstance(response, list) else None,
        response_logprobs=[float(x) for x in logprobs] if isinstance(logprobs, list) else None,
        token_source=source,
        policy_version=version if type(version) is int else rollout.resources_version,
        finish_reason=_finish_reason(gateway) or next(filter(None, map(_finish_reason, framework)), None),
    )


def _finish_reason(span: Span) -> str | None:
    reasons = span.attributes.get(semconv.GEN_AI_RESPONSE_FINISH_REASONS)
    if isinstance(reasons, list) and reasons:
        return str(reasons[0])
    return reasons if isinstance(reasons, str) and reasons else None


def _exclusion(
    call: LLMCall,
    select: Callable[[str | None], bool],
    allow_retokenized: bool,
    limits: tuple[int | None, int | None, int | None],
) -> tuple[ExclusionReason | None, str | None]:
    if not select(call.agent_name):
        return ExclusionReason.AGENT_NOT_SELECTED, f"agent {call.agent_name!r}"
    gateway = call.gateway_span
    if gateway is None:
        return ExclusionReason.NO_TOKEN_IDS, "framework LLM span with no gateway span (no matching response id)"
    if gateway.status.code == StatusCode.ERROR:
        return ExclusionReason.FAILED_CALL, gateway.status.message or "gateway span status ERROR"
    if call.token_source == TokenSource.MISSING or call.prompt_ids is None or call.response_ids is None:
        return ExclusionReason.NO_TOKEN_IDS, f"token_source={call.token_source.value}"
    if _int_list(call.prompt_ids) is None or _int_list(call.response_ids) is None:
        return ExclusionReason.MALFORMED, "token ids are not lists of integers"
    if call.response_logprobs is not None and len(call.response_logprobs) != len(call.response_ids):
        return (
            ExclusionReason.MALFORMED,
            f"{len(call.response_logprobs)} logprobs for {len(call.response_ids)} response tokens",
        )
    if call.token_source == TokenSource.RETOKENIZED and not allow_retokenized:
        return ExclusionReason.RETOKENIZED, "ids reconstructed by tokenizing text (allow_retokenized=False)"
    drift = gateway.attributes.get(semconv.TOKEN_DRIFT)
    if call.token_source == TokenSource.RETOKENIZED and drift:
        return ExclusionReason.TOKEN_DRIFT, str(drift)
    if not call.response_ids:
        return ExclusionReason.EMPTY_RESPONSE, None
    max_prompt, max_response, max_total = limits
    n_prompt, n_response = len(call.prompt_ids), len(call.response_ids)
    if max_prompt is not None and n_prompt > max_prompt:
        return ExclusionReason.OVER_LENGTH, f"prompt {n_prompt} > max_prompt_length {max_prompt}"
    if max_response is not None and n_response > max_response:
        return ExclusionReason.OVER_LENGTH, f"response {n_response} > max_response_length {max_response}"
    if max_total is not None and n_prompt + n_response > max_total:
        return ExclusionReason.OVER_LENGTH, f"prompt+response {n_prompt + n_response} > max_length {max_total}"
    return None, None


# --- rewards -----------------------------------------------------------------------------------


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _reward_fields(span: Span) -> tuple[float | None, str | None, dict[str, float]]:
    attrs = span.attributes
    name = attrs.get(semconv.REWARD_PRIMARY)
    name = name if isinstance(name, str) and name else None
    dims: dict[str, float] = {}
    parsed = sp.parse_json_attr(span, semconv.REWARD_DIMENSIONS)
    if isinstance(parsed, Mapping):
        dims = {str(k): v for k, v in ((k, _finite(v)) for k, v in parsed.items()) if v is not None}
    value = _finite(attrs.get(semconv.REWARD_VALUE))
    if value is None and semconv.REWARD_VALUE not in attrs and name is not None:
        value = dims.get(name)
    return value, name, dims


def _is_final(span: Span) -> bool:
    flag = span.attributes.get(semconv.REWARD_IS_FINAL)
    return flag is True or (isinstance(flag, str) and flag.lower() == "true")


def _attach_rewards(
    rollout: Rollout,
    ordered: list[Span],
    calls: list[LLMCall],
    notes: Counter[str],
    promote_trailing_reward: bool,
) -> tuple[list[RewardRecord], float | None, Literal["span", "rollout", "trailing_reward"] | None]:
    call_of_member = {sid: c.index for c in calls for sid in c.span_ids}
    call_of_response: dict[str, int] = {}
    for c in calls:
        if c.response_id is not None:
            call_of_response.setdefault(c.response_id, c.index)
    positions = [c.position for c in calls]

    records: list[RewardRecord] = []
    for pos, span in enumerate(ordered):
        if not sp.is_reward_span(span):
            continue
        value, name, dims = _reward_fields(span)
        common: dict[str, Any] = {"span_id": span.span_id, "position": pos, "name": name, "dimensions": dims}
        final = _is_final(span)
        if value is None:
            raw = span.attributes.get(semconv.REWARD_VALUE)
            detail = "no agentbolt.reward.value" if raw is None else f"non-finite or non-numeric value {raw!r}"
            records.append(RewardRecord(value=None, is_final=final, attachment="malformed", detail=detail, **common))
            notes["rewards_malformed"] += 1
            continue
        if final:
            records.append(RewardRecord(value=value, is_final=True, attachment="final", **common))
            continue
        attrs = span.attributes
        target_span, target_resp = (
            attrs.get(semconv.REWARD_TARGET_SPAN_ID),
            attrs.get(semconv.REWARD_TARGET_RESPONSE_ID),
        )
        target = str(target_span) if target_span else str(target_resp) if target_resp else None
        if target_span:
            index = call_of_member.get(str(target_span))
            attachment: RewardAttachment = "target_span" if index is not None else "unattached"
            detail = None if index is not None else f"target span {target_span!r} is not an LLM call of this attempt"
        elif target_resp:
            index = call_of_response.get(str(target_resp))
            attachment = "target_response" if index is not None else "unattached"
            detail = None if index is not None else f"no LLM call with response id {target_resp!r}"
        else:
            i = bisect_left(positions, pos)
            index = i - 1 if i > 0 else None
            attachment = "preceding" if index is not None else "unattached"
            detail = None if index is not None else "no LLM call precedes it"
        notes[f"rewards_{attachment}"] += 1
        records.append(
            RewardRecord(
                value=value,
                is_final=False,
                attachment=attachment,
                call_index=index,
                target=target,
                detail=detail,
                **common,
            )
        )

    finals = [r for r in records if r.attachment == "final"]
    if finals:
        if len(finals) > 1:
            notes["final_rewards_superseded"] += len(finals) - 1
            records = [
                replace(r, detail="superseded by a later final reward")
                if r.attachment == "final" and r is not finals[-1]
                else r
                for r in records
            ]
        value = finals[-1].value
        if rollout.final_reward is not None and rollout.final_reward != value:
            notes["final_reward_differs_from_rollout"] += 1
        return records, value, "span"
    if rollout.final_reward is not None and math.isfinite(rollout.final_reward):
        return records, float(rollout.final_reward), "rollout"
    if promote_trailing_reward:
        last_call = positions[-1] if positions else -1
        valid = [i for i, r in enumerate(records) if r.attachment != "malformed"]
        if valid:
            i = valid[-1]
            r = records[i]
            if r.target is None and r.position > last_call:
                records[i] = replace(r, attachment="final", call_index=None, detail="promoted trailing reward")
                notes[f"rewards_{r.attachment}"] -= 1
                notes["rewards_promoted_to_final"] += 1
                return records, r.value, "trailing_reward"
    return records, None, None
