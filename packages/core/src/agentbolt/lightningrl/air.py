"""AIR: automatic intermediate rewards derived from spans.

The agent emits nothing extra: rules read what the trace already says (a tool call failed,
an exception was raised, a response does not follow the expected format, generation was cut
at the length limit) and turn it into signals ``(call i, value)``. With ``a_i`` the sum of the
signal values on call i, ``e_i`` the emitted intermediate reward (``r_i`` when
``include_emitted``, else 0) and ``R`` the episode return:

- ``aggregate="intermediate"`` (default): ``c_i = w_R · R + e_i + a_i``
- ``aggregate="discounted"``: ``c_i = Σ_{k=i}^{N-1} gamma^{k-i} (e_k + a_k) + gamma^{N-1-i} w_R · R``

Where signals attach:

- **tool results** (``execute_tool`` spans): to the call whose response requested the tool
  call with the span's ``gen_ai.tool.call.id``; else to the call enclosing the tool span; else
  (``fallback="preceding"``) to the latest call before it in ``seq``; else unmatched. A tool
  span failed when its status is ERROR or it has ``error.type``.
- **exceptions** (``agentbolt.exception`` spans, or any non-LLM span with status ERROR and an
  ``exception`` event): to the call enclosing the span, else the latest call before it. An
  exception recorded again as it propagates counts once: a record with the same type and
  message as an earlier one is skipped when it is an ancestor of that record, or a terminal
  record (a span with no parent, such as the runner's ``agentbolt.exception`` span when the
  agent raised); at most one per (call, type, message). The same error caught and raised
  again inside the agent at a later step counts again. When the tool rule is active, failed tool spans are not exceptions, and their
  propagated records are skipped by the same rule. Failed LLM calls are infrastructure errors,
  not penalised.
- **format** and **finish reason**: on the call itself.

Every match method and unmatched signal is counted in the batch report (``air.*`` notes).
"""

from __future__ import annotations

import abc
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from .. import semconv
from ..errors import UserError
from ..types import Span
from . import spans as sp
from .credit import Credit, CreditAssigner, _check_gamma, discounted_returns
from .episode import AgentMatch, Episode, agent_selector

__all__ = [
    "AIRCredit",
    "AIRRule",
    "AIRSignal",
    "ExceptionRule",
    "FinishReasonRule",
    "FormatRule",
    "ToolCallRule",
]

Match = Literal["tool_call_id", "enclosing", "preceding", "call", "unmatched"]


@dataclass(frozen=True)
class AIRSignal:
    """One automatic reward on one call."""

    rule: str
    """Name of the signal (``tool_error``, ``exception``, ``format``, ...)."""
    value: float
    """Reward added to the call (negative for a penalty)."""
    call_index: int | None
    """The call it applies to; ``None`` when it matched no call (reported, not applied)."""
    match: Match
    """How the call was found."""
    span_id: str | None = None
    """The span that produced the signal."""


class AIRRule(abc.ABC):
    """A source of automatic intermediate rewards."""

    @abc.abstractmethod
    def signals(self, episode: Episode) -> Iterable[AIRSignal]:
        """The signals this rule derives from ``episode``."""

    def __repr__(self) -> str:
        options = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({options})"


def _locate(episode: Episode, span_position: int, span: Span, fallback: bool) -> tuple[int | None, Match]:
    index = episode.enclosing_call(span)
    if index is not None:
        return index, "enclosing"
    if fallback:
        index = episode.preceding_call(span_position)
        if index is not None:
            return index, "preceding"
    return None, "unmatched"


class ToolCallRule(AIRRule):
    """``failure`` on the call that issued a failed tool call, ``success`` on one that succeeded.

    Args:
        failure: value of a failed tool call (status ERROR or ``error.type`` set).
        success: value of a successful tool call (0 to ignore successes).
        fallback: ``"preceding"`` attaches a tool span with no matching tool call id to the
            latest call before it in ``seq``; ``"none"`` leaves it unmatched.
    """

    def __init__(
        self, *, failure: float = -1.0, success: float = 0.0, fallback: Literal["preceding", "none"] = "preceding"
    ) -> None:
        if fallback not in ("preceding", "none"):
            raise UserError(f"fallback must be 'preceding' or 'none', got {fallback!r}")
        self.failure = float(failure)
        self.success = float(success)
        self.fallback = fallback

    def signals(self, episode: Episode) -> Iterable[AIRSignal]:
        for pos, span in enumerate(episode.spans):
            if not sp.is_tool_span(span):
                continue
            failed = sp.is_failed_tool_span(span)
            value = self.failure if failed else self.success
            rule = "tool_error" if failed else "tool_success"
            if value == 0.0:
                continue
            tid = span.attributes.get(semconv.GEN_AI_TOOL_CALL_ID)
            index = episode.call_for_tool_call_id(str(tid)) if tid else None
            if index is not None:
                yield AIRSignal(rule, value, index, "tool_call_id", span.span_id)
                continue
            index, how = _locate(episode, pos, span, self.fallback == "preceding")
            yield AIRSignal(rule, value, index, how, span.span_id)


class ExceptionRule(AIRRule):
    """``penalty`` on the call during or after which an exception was raised.

    Args:
        penalty: value of one exception.
        skip_tool_errors: leave failed tool spans, and their exception propagating further, to
            ``ToolCallRule``.
    """

    def __init__(self, *, penalty: float = -1.0, skip_tool_errors: bool = True) -> None:
        self.penalty = float(penalty)
        self.skip_tool_errors = skip_tool_errors

    def signals(self, episode: Episode) -> Iterable[AIRSignal]:
        counted: dict[tuple[str, str], list[Span]] = {}
        if self.skip_tool_errors:
            for s in episode.spans:
                if sp.is_failed_tool_span(s):
                    counted.setdefault(sp.exception_key(s), []).append(s)
        seen: set[tuple[int | None, tuple[str, str]]] = set()
        for pos, span in enumerate(episode.spans):
            if not sp.is_exception_span(span) or sp.is_llm_span(span):
                continue
            if self.skip_tool_errors and sp.is_tool_span(span):
                continue
            key = sp.exception_key(span)
            earlier = counted.get(key, [])
            if earlier and (_is_terminal(span) or any(_is_ancestor(span, e, episode) for e in earlier)):
                continue  # the same exception, recorded again while it propagated
            index, how = _locate(episode, pos, span, fallback=True)
            if (index, key) in seen:
                continue
            seen.add((index, key))
            counted.setdefault(key, []).append(span)
            yield AIRSignal("exception", self.penalty, index, how, span.span_id)


def _is_terminal(span: Span) -> bool:
    """A record made where an exception left the agent (the runner's ``agentbolt.exception``
    span, a failed root span): a span with no parent."""
    return span.parent_span_id is None


def _is_ancestor(span: Span, of: Span, episode: Episode) -> bool:
    return any(a.span_id == span.span_id for a in sp.ancestors(of, episode.span_by_id))


class FormatRule(AIRRule):
    """``penalty`` on each call whose response text does not match ``pattern`` (``bonus`` when it does).

    Args:
        pattern: regular expression (``re.search`` unless ``fullmatch``; use ``(?s)`` for DOTALL).
        penalty: value of a mismatch.
        bonus: value of a match.
        agents: check only these agents' calls (:data:`~agentbolt.lightningrl.episode.AgentMatch`).
        skip_tool_calls: do not check a response that requested tool calls.
        fullmatch: the whole text must match.
    """

    def __init__(
        self,
        pattern: str | re.Pattern[str],
        *,
        penalty: float = -1.0,
        bonus: float = 0.0,
        agents: AgentMatch = None,
        skip_tool_calls: bool = True,
        fullmatch: bool = False,
    ) -> None:
        try:
            self.pattern = re.compile(pattern)
        except re.error as exc:
            raise UserError(f"format pattern {pattern!r} is not a valid regular expression: {exc}") from exc
        self.penalty = float(penalty)
        self.bonus = float(bonus)
        self.agents = agents
        self._select = agent_selector(agents)
        self.skip_tool_calls = skip_tool_calls
        self.fullmatch = fullmatch

    def signals(self, episode: Episode) -> Iterable[AIRSignal]:
        for call in episode.calls:
            if not self._select(call.agent_name):
                continue
            text = call.response_text
            if text is None:
                yield AIRSignal("format_no_text", 0.0, call.index, "call", call.span_id)
                continue
            if self.skip_tool_calls and call.tool_call_ids:
                continue
            ok = (self.pattern.fullmatch(text) if self.fullmatch else self.pattern.search(text)) is not None
            value = self.bonus if ok else self.penalty
            if value != 0.0:
                yield AIRSignal("format", value, call.index, "call", call.span_id)


class FinishReasonRule(AIRRule):
    """A value per finish reason, e.g. ``{"length": -1.0}`` penalises truncated responses."""

    def __init__(self, values: Mapping[str, float] | None = None) -> None:
        self.values = {str(k): float(v) for k, v in (values if values is not None else {"length": -1.0}).items()}

    def signals(self, episode: Episode) -> Iterable[AIRSignal]:
        for call in episode.calls:
            value = self.values.get(call.finish_reason or "")
            if value:
                yield AIRSignal(f"finish_{call.finish_reason}", value, call.index, "call", call.span_id)


class AIRCredit(CreditAssigner):
    """AIR credit: the episode return plus automatic intermediate rewards (math in the module docstring).

    With no ``rules``, the rules are built from the scalar options (a rule whose value is 0 is
    left out): ``ToolCallRule(failure=tool_error, success=tool_success)``,
    ``ExceptionRule(penalty=exception)``, ``FormatRule(format_pattern, penalty=format_penalty,
    bonus=format_bonus, agents=format_agents)`` when a pattern is given, and
    ``FinishReasonRule({"length": truncation})``.

    Args:
        tool_error, tool_success, exception, truncation: rule values.
        format_pattern, format_penalty, format_bonus, format_agents: the format check.
        tool_fallback: ``"preceding"`` or ``"none"`` for tool spans without a matching call id.
        rules: explicit rules, replacing the ones built from the options above.
        aggregate: ``"intermediate"`` or ``"discounted"``.
        gamma: discount for ``aggregate="discounted"``.
        include_emitted: add the emitted intermediate rewards ``r_i``.
        final_weight: w_R.
    """

    name = "air"

    def __init__(
        self,
        *,
        tool_error: float = -1.0,
        tool_success: float = 0.0,
        exception: float = -1.0,
        truncation: float = 0.0,
        format_pattern: str | re.Pattern[str] | None = None,
        format_penalty: float = -1.0,
        format_bonus: float = 0.0,
        format_agents: AgentMatch = None,
        tool_fallback: Literal["preceding", "none"] = "preceding",
        rules: Sequence[AIRRule] | None = None,
        aggregate: Literal["intermediate", "discounted"] = "intermediate",
        gamma: float = 1.0,
        include_emitted: bool = True,
        final_weight: float = 1.0,
    ) -> None:
        if aggregate not in ("intermediate", "discounted"):
            raise UserError(f"aggregate must be 'intermediate' or 'discounted', got {aggregate!r}")
        self.aggregate = aggregate
        self.gamma = _check_gamma(gamma)
        self.include_emitted = include_emitted
        self.final_weight = float(final_weight)
        if rules is not None:
            bad = [r for r in rules if not isinstance(r, AIRRule)]
            if bad:
                raise UserError(f"rules must be AIRRule instances, got {bad!r}")
            self.rules: list[AIRRule] = list(rules)
            return
        built: list[AIRRule] = []
        if tool_error or tool_success:
            built.append(ToolCallRule(failure=tool_error, success=tool_success, fallback=tool_fallback))
        if exception:
            built.append(ExceptionRule(penalty=exception, skip_tool_errors=bool(tool_error)))
        if format_pattern is not None:
            built.append(FormatRule(format_pattern, penalty=format_penalty, bonus=format_bonus, agents=format_agents))
        if truncation:
            built.append(FinishReasonRule({"length": truncation}))
        self.rules = built

    def signals(self, episode: Episode) -> list[AIRSignal]:
        """Every signal of every rule on ``episode``."""
        return [s for rule in self.rules for s in rule.signals(episode)]

    def assign(self, episode: Episode) -> Credit | None:
        if episode.final_reward is None:
            return None
        n = len(episode.calls)
        auto = [0.0] * n
        parts: list[dict[str, float]] = [{} for _ in range(n)]
        notes: Counter[str] = Counter()
        for s in self.signals(episode):
            notes[f"air.{s.rule}.{s.match}"] += 1
            if s.call_index is None or s.value == 0.0:
                continue
            auto[s.call_index] += s.value
            part = parts[s.call_index]
            part[f"air.{s.rule}"] = part.get(f"air.{s.rule}", 0.0) + s.value
        emitted = episode.step_rewards if self.include_emitted else (0.0,) * n
        base = self.final_weight * episode.final_reward
        steps = [e + a for e, a in zip(emitted, auto, strict=True)]
        if self.aggregate == "intermediate":
            rewards = [base + x for x in steps]
        else:
            rewards = discounted_returns(steps, base, self.gamma)
        components = tuple(
            {"final": base, **({"intermediate": emitted[i]} if emitted[i] else {}), **parts[i]} for i in range(n)
        )
        return Credit(rewards=tuple(rewards), components=components, notes=dict(notes))
