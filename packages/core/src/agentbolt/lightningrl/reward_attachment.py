"""Rewards of an episode: reward spans parsed (:class:`RewardRecord`), attached to calls, and the episode return.

Implements the **Rewards** rules of :mod:`agentbolt.lightningrl.extraction`: a final reward is
the episode return (the highest source precedence wins, client > judge > agent, then the
latest: :mod:`agentbolt.reward_precedence`); an intermediate reward attaches to its explicit target
(span id, then response id), else to the latest call before it; without a final reward the
return is ``Rollout.final_reward``, else (optionally) a promoted trailing reward, else missing.

Every value is checked (:mod:`agentbolt.reward_validation`) against the run's
:class:`~agentbolt.reward_validation.RewardBounds`: a value outside a declared range is clipped
(``rewards_clipped``) when the run says so; a value that is refused (not a number, not finite,
beyond ``1e15`` in magnitude, outside the range) is kept as ``malformed`` with its reason and puts
the rollout in **quarantine** (the first refusal is returned): none of its calls train.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Literal

from .. import semconv
from ..reward_precedence import RANKS, reward_source
from ..reward_validation import RewardBounds, RewardRefused, reward_number
from ..types import Rollout, Span
from . import spans as sp
from .episode import LLMCall, RewardAttachment, RewardRecord

__all__ = ["attach_rewards"]


_DEFAULT_BOUNDS = RewardBounds()

Quarantine = tuple[str, str]
"""(reason, detail) of a rollout put in quarantine."""


def _dimension(value: Any) -> float | None:
    """A named dimension's value when it is a reward number (the one rule,
    :func:`~agentbolt.reward_validation.reward_number`), else ``None`` (left out of the dimensions)."""
    try:
        return reward_number(value)
    except RewardRefused:
        return None


def _reward_fields(
    span: Span, bounds: RewardBounds, notes: Counter[str]
) -> tuple[float | None, str | None, dict[str, float], RewardRefused | None]:
    """(value, primary name, dimensions, the refusal of a value present but refused)."""
    attrs = span.attributes
    name = attrs.get(semconv.REWARD_PRIMARY)
    name = name if isinstance(name, str) and name else None
    dims: dict[str, float] = {}
    parsed = sp.parse_json_attr(span, semconv.REWARD_DIMENSIONS)
    if isinstance(parsed, Mapping):
        dims = {str(k): v for k, v in ((k, _dimension(v)) for k, v in parsed.items()) if v is not None}
    raw = attrs.get(semconv.REWARD_VALUE)
    if raw is None and name is not None and isinstance(parsed, Mapping):
        raw = parsed.get(name)  # unfiltered: a primary dimension that is not a reward is refused, not absent
    if raw is None:
        return None, name, dims, None
    try:
        value, clipped = bounds.check(raw, f"reward of span {span.span_id}")
    except RewardRefused as exc:
        return None, name, dims, exc
    notes["rewards_clipped"] += clipped
    return value, name, dims, None


def _is_final(span: Span) -> bool:
    flag = span.attributes.get(semconv.REWARD_IS_FINAL)
    return flag is True or (isinstance(flag, str) and flag.lower() == "true")


def attach_rewards(
    rollout: Rollout,
    ordered: list[Span],
    calls: list[LLMCall],
    notes: Counter[str],
    promote_trailing_reward: bool,
    bounds: RewardBounds | None = None,
) -> tuple[list[RewardRecord], float | None, Literal["span", "rollout", "trailing_reward"] | None, Quarantine | None]:
    """(a record per reward span in ``seq`` order, the episode return, where the return came from,
    the quarantine of the rollout or ``None``).

    ``calls`` are the episode's calls (:func:`~agentbolt.lightningrl.calls.extract_calls`);
    ``notes`` counts attachments, malformed, clipped and superseded rewards (updated in place). The
    return is ``None`` (source ``None``) when missing. ``bounds``: the run's declared range
    (default: none; every value is still checked for type, finiteness and magnitude).
    """
    bounds = bounds or _DEFAULT_BOUNDS
    quarantine: Quarantine | None = None
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
        value, name, dims, refused = _reward_fields(span, bounds, notes)
        detail: str | None
        common: dict[str, Any] = {"span_id": span.span_id, "position": pos, "name": name, "dimensions": dims}
        final = _is_final(span)
        if value is None:
            detail = "no agentbolt.reward.value" if refused is None else str(refused)
            if refused is not None and quarantine is None:
                quarantine = (refused.reason, str(refused))
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
        attributes = {span.span_id: span.attributes for span in ordered}
        winner = max(
            enumerate(finals), key=lambda item: (RANKS[reward_source(attributes.get(item[1].span_id, {}))], item[0])
        )[1]
        if len(finals) > 1:
            notes["final_rewards_superseded"] += len(finals) - 1
            records = [
                replace(r, detail="superseded by a final reward of higher precedence or later")
                if r.attachment == "final" and r is not winner
                else r
                for r in records
            ]
        value = winner.value
        if rollout.final_reward is not None and rollout.final_reward != value:
            notes["final_reward_differs_from_rollout"] += 1
        return records, value, "span", quarantine
    if rollout.final_reward is not None:
        try:
            value, clipped = bounds.check(rollout.final_reward, f"final_reward of rollout {rollout.rollout_id}")
        except RewardRefused as exc:
            return records, None, None, quarantine or (exc.reason, str(exc))
        notes["rewards_clipped"] += clipped
        return records, value, "rollout", quarantine
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
                return records, r.value, "trailing_reward", quarantine
    return records, None, None, quarantine
