"""Extraction: the spans of a rollout's final attempt → an :class:`~agentbolt.lightningrl.episode.Episode`.

:func:`extract_episode` is the entry point; it selects and orders the spans here, then builds
the calls (:mod:`.calls`) and attaches the rewards (:mod:`.reward_attachment`). The rules, in
one place:

Rules (all ordering is by the store-assigned ``seq``, never by clocks):

**Spans considered.** Spans of the rollout whose ``attempt_id`` is the rollout's final attempt
(``Rollout.current_attempt_id``, else the attempt of the latest span) or ``None`` (records
written outside an attempt, such as a runner's final reward). Others are counted in
``Episode.notes["spans_other_attempts"]``.

**Calls.** Every gateway LLM-call span is one call. A framework LLM span (adapter or GenAI
instrumentation) joins, in this order: the gateway call with the same ``gen_ai.response.id``;
the gateway call it is an ancestor of (W3C traceparent propagated); the gateway call whose
request fingerprint (:mod:`agentbolt.request_fingerprint`) its input messages have, started
within :data:`~agentbolt.lightningrl.calls.JOIN_WINDOW_S` after the span ended (a streamed
request outlives the instrumentation's span) — the strict fingerprint first, then the
last-message one, the latest such span before the call when several match (answered calls
choose before failed ones, later calls before earlier ones, so identical requests of one rollout,
retried or in flight together, each join their own span); as a counted last
resort, when the counts match, by order. Framework LLM spans nested in another framework LLM
span belong to the outermost one. Joined spans are one call (never counted twice). A call's
position is its gateway span's ``seq``.

**Reconciliation.** When the attempt has any gateway call, the calls are exactly its gateway
calls: a framework LLM span that joins none is an operation span, counted
(``unjoined_llm_spans``), never a call and never a credit-bearing step. One that carries a
response (response id, output messages, output tokens) is a model call the gateway did not see
or a join that failed: the rollout is flagged (:class:`~agentbolt.lightningrl.episode.Reconciliation`)
and its calls are excluded (``unreconciled``) unless ``unreconciled="train"``. When the
attempt has no gateway call at all (a backend agentbolt does not front), each framework LLM
span is a call with no token ids (excluded, reported): the ids-less path.

**Agent name.** ``gen_ai.agent.name`` of the nearest enclosing agent span (via
``parent_span_id`` chains of the call's framework spans, then of its gateway span), else the
call's own ``gen_ai.agent.name`` attribute, else ``None``.

**Exclusions** (first that applies, in this order): ``unreconciled`` (the rollout is
flagged), ``agent_not_selected`` (``agent_match``
rejects the agent), ``failed_call`` (gateway span status ERROR), ``no_token_ids``
(``token_source=missing``, ids absent, or no gateway span), ``malformed`` (ids not integer
lists, logprobs length ≠ response length), ``retokenized`` (unless allowed),
``empty_response``, ``over_length`` (prompt/response/total over the configured maximum).
Excluded calls stay in the episode (credit is computed over every call, and the calls are the
reconciled ones), only their transitions are not produced.

**Rewards.** A reward span (``agentbolt.reward`` / kind ``reward``) has value
``agentbolt.reward.value`` (else ``dimensions[primary]``); one without a finite value is
``malformed`` and ignored (reported). With ``agentbolt.reward.final = true`` it is a final
reward: the episode return is the one of the highest source (``agentbolt.feedback.source``:
client > judge > agent, :mod:`agentbolt.reward_precedence`), the last in ``seq`` of that source. A non-final reward is intermediate and
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

from collections import Counter
from collections.abc import Sequence
from typing import Literal

from ..reward_validation import RewardBounds
from ..types import Rollout, Span
from .calls import extract_calls
from .episode import AgentMatch, Episode, agent_selector
from .reward_attachment import attach_rewards

__all__ = ["extract_episode", "final_attempt_spans", "order_spans"]


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
    unreconciled: Literal["exclude", "train"] = "exclude",
    reward_bounds: RewardBounds | None = None,
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
        unreconciled: what happens to the calls of a rollout flagged by reconciliation:
            ``exclude`` (reason ``unreconciled``) or ``train`` (the flag is still reported).
        reward_bounds: the run's declared reward range (:class:`~agentbolt.reward_validation.RewardBounds`);
            a refused reward value puts the episode in quarantine (:attr:`Episode.quarantine`).
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

    calls, reconciliation = extract_calls(
        ordered,
        by_id,
        position,
        rollout,
        notes,
        select=select,
        allow_retokenized=allow_retokenized,
        limits=(max_prompt_length, max_response_length, max_length),
        train_unreconciled=unreconciled == "train",
    )
    rewards, final, source, quarantine = attach_rewards(
        rollout, ordered, calls, notes, promote_trailing_reward, reward_bounds
    )
    return Episode(
        rollout=rollout,
        attempt_id=attempt_id,
        spans=tuple(ordered),
        calls=tuple(calls),
        rewards=tuple(rewards),
        final_reward=final,
        final_source=source,
        notes={k: v for k, v in notes.items() if v},
        reconciliation=reconciliation,
        quarantine=quarantine,
    )
