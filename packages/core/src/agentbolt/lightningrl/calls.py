"""The LLM calls of an episode: gateway and framework spans joined into calls (:class:`LLMCall`), with exclusions.

Implements the **Calls**, **Reconciliation**, **Agent name** and **Exclusions** rules of
:mod:`agentbolt.lightningrl.extraction`: :func:`extract_calls` groups nested framework LLM
spans, joins each group to its gateway span (by ``gen_ai.response.id``, then by ancestry, then
by request fingerprint within a time window, then, as a counted last resort, by order), keeps
only gateway calls as calls when the rollout has any (reconciliation), reads the token data of
the gateway span and decides why a call produces no transition.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, Final

from .. import semconv
from ..request_fingerprint import FULL, TAIL, fingerprints
from ..types import Rollout, Span, StatusCode, TokenSource
from . import spans as sp
from .episode import ExclusionReason, LLMCall, Reconciliation

__all__ = ["JOIN_SKEW_S", "JOIN_WINDOW_S", "extract_calls"]


JOIN_WINDOW_S: Final = 120.0
"""A fingerprint join pairs a framework LLM span with a gateway call that started at most this long
after the span ended (a streamed request is sent after the instrumentation's span has ended)..."""
JOIN_SKEW_S: Final = 5.0
"""... or at most this long before the span started (clocks of the agent's and the gateway's process)."""


def extract_calls(
    ordered: list[Span],
    by_id: dict[str, Span],
    position: dict[str, int],
    rollout: Rollout,
    notes: Counter[str],
    *,
    select: Callable[[str | None], bool],
    allow_retokenized: bool,
    limits: tuple[int | None, int | None, int | None],
    train_unreconciled: bool = False,
) -> tuple[list[LLMCall], Reconciliation]:
    """Every LLM call of the ordered spans, in ``seq`` order, each with its exclusion (if any),
    and how the framework spans reconciled with the gateway calls.

    Args:
        ordered: the attempt's spans in ``seq`` order; ``by_id`` and ``position`` index them.
        rollout: the rollout (its ``resources_version`` is the fallback policy version).
        notes: counters of what was noticed (joins, nested framework spans...), updated in place.
        select: which agents are trained (from :func:`~agentbolt.lightningrl.episode.agent_selector`).
        allow_retokenized: train on calls whose ids were retokenized.
        limits: maximum prompt, response and total length (``None``: no limit).
        train_unreconciled: train the calls of a flagged rollout anyway (the flag is still reported).
    """
    grouped, reconciliation = _group_calls(ordered, by_id, position, notes)
    flag = None if train_unreconciled else reconciliation.flag
    calls: list[LLMCall] = []
    for index, (pos, gateway, framework) in enumerate(grouped):
        call = _make_call(index, pos, gateway, framework, by_id, rollout)
        reason, detail = (
            (ExclusionReason.UNRECONCILED, flag)
            if flag is not None
            else _exclusion(call, select, allow_retokenized, limits)
        )
        if reason is not None:
            call = replace(call, exclusion=reason, exclusion_detail=detail)
        calls.append(call)
    return calls, reconciliation


def _group_calls(
    ordered: list[Span], by_id: dict[str, Span], position: dict[str, int], notes: Counter[str]
) -> tuple[list[tuple[int, Span | None, tuple[Span, ...]]], Reconciliation]:
    """(position, gateway span, framework spans) of every call, in position order, and the
    reconciliation of framework spans with gateway calls."""
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
    _join_by_fingerprint(gateways, clusters, joined, notes)
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
    unjoined = [root for root in clusters if root not in used]
    if not gateways:  # the backend is not fronted: framework spans are the calls (no token ids)
        for root in unjoined:
            members = clusters[root]
            out.append((min(position[m.span_id] for m in members), None, tuple(members)))
        out.sort(key=lambda c: c[0])
        return out, Reconciliation(gateway_calls=0, calls=len(out))
    # Reconciliation: the gateway calls are the calls; a framework LLM span joining none is an
    # operation, counted, and one that carries a response flags the rollout.
    out.sort(key=lambda c: c[0])
    n_unjoined = sum(len(clusters[root]) for root in unjoined)
    with_response = [root for root in unjoined if any(_has_response(m) for m in clusters[root])]
    if n_unjoined:
        notes["unjoined_llm_spans"] += n_unjoined
    flag = None
    if with_response:
        notes["unjoined_llm_spans_with_response"] += len(with_response)
        names = ", ".join(sorted({clusters[root][0].name for root in with_response}))
        flag = (
            f"{len(with_response)} framework LLM span(s) with a response joined none of the {len(gateways)} "
            f"gateway calls ({names}): a model call that bypassed the gateway (a client not built from "
            "resources.llm.base_url) or a join that failed (no shared response id, traceparent or request "
            "fingerprint); point every client at the rollout's base URL, or record the span's input messages"
        )
    return out, Reconciliation(
        gateway_calls=len(gateways),
        calls=len(out),
        joined_framework_spans=sum(len(clusters[root]) for root in used),
        unjoined_llm_spans=n_unjoined,
        unjoined_with_response=len(with_response),
        flag=flag,
    )


def _join_by_fingerprint(
    gateways: list[Span], clusters: dict[str, list[Span]], joined: dict[str, str], notes: Counter[str]
) -> None:
    """Join the gateway calls still open to framework spans whose input messages have the same
    fingerprint (:mod:`agentbolt.request_fingerprint`), strict fingerprint first, within the time
    window; among several candidates, the one that started last before the call (the span that
    made the request, not an earlier one that only prepared it)."""
    used = set(joined.values())
    prints: dict[str, list[str]] = {}
    for root, members in clusters.items():
        if root not in used and (found := _cluster_fingerprints(members)) is not None:
            prints[root] = found
    if not prints:
        return
    window, skew = int(JOIN_WINDOW_S * 1e9), int(JOIN_SKEW_S * 1e9)
    for level, note in ((FULL, "joined_by_fingerprint"), (TAIL, "joined_by_tail_fingerprint")):
        for g in sorted(gateways, key=lambda g: g.start_time_ns):
            if g.span_id in joined:
                continue
            mine = _gateway_fingerprints(g)
            if mine is None:
                continue
            candidates = [
                root
                for root, p in prints.items()
                if root not in used
                and p[level] == mine[level]
                and min(m.start_time_ns for m in clusters[root]) - skew
                <= g.start_time_ns
                <= max(m.end_time_ns or m.start_time_ns for m in clusters[root]) + window
            ]
            if not candidates:
                continue
            start = {root: min(m.start_time_ns for m in clusters[root]) for root in candidates}
            before = [root for root in candidates if start[root] <= g.start_time_ns]
            root = max(before, key=start.__getitem__) if before else min(candidates, key=start.__getitem__)
            joined[g.span_id] = root
            used.add(root)
            notes[note] += 1


def _gateway_fingerprints(span: Span) -> list[str] | None:
    value = span.attributes.get(semconv.LLM_REQUEST_FINGERPRINT)
    if isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value):
        return [str(v) for v in value]
    return fingerprints(span.attributes.get(semconv.GEN_AI_INPUT_MESSAGES))


def _cluster_fingerprints(members: list[Span]) -> list[str] | None:
    for span in members:
        value = span.attributes.get(semconv.LLM_REQUEST_FINGERPRINT)
        if isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value):
            return [str(v) for v in value]
        messages = sp.input_messages(span)
        if messages:
            return fingerprints(messages)
    return None


def _has_response(span: Span) -> bool:
    """The span recorded an answer: a response id, output messages or output tokens."""
    if _response_id(span) is not None or sp.output_messages(span):
        return True
    tokens = sp.genai_attribute(span, semconv.GEN_AI_USAGE_OUTPUT_TOKENS)
    return isinstance(tokens, int | float) and not isinstance(tokens, bool) and tokens > 0


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
    served_by = attrs.get(semconv.POLICY_NAME)
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
        policy_name=served_by if isinstance(served_by, str) and served_by else None,
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
        why = gateway.attributes.get(semconv.TOKEN_MISSING_REASON)
        detail = f"token_source={call.token_source.value}"
        return ExclusionReason.NO_TOKEN_IDS, f"{detail}: {why}" if isinstance(why, str) and why else detail
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
