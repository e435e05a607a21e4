"""``agentbolt doctor``: what a run captured, what it will train on, and what to fix — from the store.

    agentbolt doctor --store sqlite:///runs.db                 # everything in the store
    agentbolt doctor --store sqlite:///runs.db --run run-3f2a  # one run (its rollout id prefix)

``Trainer.dev`` prints the same report (with the gateway's own counters). Counts come from the
stored spans of **every attempt** of the selected rollouts; each finding says what to do:

- ``not_recorded``: calls the gateway sent upstream without a span in the store (gateway counters);
- ``no_calls``: rollouts that made no LLM call through the gateway;
- ``missing_token_ids`` / ``retokenized`` / ``token_drift``: token sources of successful calls;
- ``failed_calls``: calls the upstream failed (counted apart from missing ids);
- ``calls_in_ended_attempts``: calls of attempts that failed or timed out (never trained on);
- ``template_rewrite``: a later call continues an earlier conversation (its messages start with
  the earlier messages and reply) but its prompt ids do not start with the earlier prompt +
  reply ids: the chat template re-rendered history, so trajectories cannot merge;
- ``adapter_failed``: adapters that failed to instrument in the runners (recorded per attempt);
- ``unreconciled``: rollouts whose framework spans and gateway calls disagree (an
  instrumentation LLM span with a response joined no gateway call: a call that bypassed the
  gateway, or a failed join); LightningRL flags them and does not train them;
- ``unjoined_llm_spans``: framework LLM spans that joined no gateway call and carry no response
  (e.g. LlamaIndex's ``_prepare_chat_with_tools``): kept as operations, never calls;
- ``unnamed_calls``: calls without an agent name (``agent_match`` cannot select them);
- ``quarantined_values``: rollouts holding a reward value training refuses (not a number, not
  finite, beyond 1e15 in magnitude): LightningRL quarantines them (:mod:`agentbolt.runs.quarantine`);
  a run's own quarantines (its ``reward_range`` included) come from its metrics (``quarantined``);
- ``singleton_groups``: training rollout groups of one, whose GRPO / RLOO advantages are all zero
  (held-out rollouts are never trained: they count only when nothing else is selected, as in
  ``Trainer.dev``).

Then, for each run among the selected rollouts, its training health
(:mod:`agentbolt.runs.health`): reward rising while the held-out reward stays flat, entropy
collapse, identical samples within groups, tools never called or dropped.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from .. import semconv
from .. import types as t
from ..errors import NotFoundError
from ..lightningrl.extraction import extract_episode
from ..lightningrl.spans import is_gateway_call
from ..store.base import Store
from .findings import Finding, Severity
from .health import RunHealth, diagnose_run
from .quarantine import QUARANTINE_FIX, quarantine_finding, quarantined_in_metrics

__all__ = ["CaptureCounts", "DoctorReport", "Finding", "Severity", "diagnose", "doctor"]


@dataclass
class CaptureCounts:
    """The numbers behind the findings (all attempts of the selected rollouts)."""

    rollouts: int = 0
    rollouts_by_status: dict[str, int] = field(default_factory=dict)
    calls: int = 0
    """Gateway LLM-call spans in the store."""
    calls_ok: int = 0
    calls_failed: int = 0
    """Calls the upstream (or the client) failed: no tokens were generated."""
    failed_by_type: dict[str, int] = field(default_factory=dict)
    exact: int = 0
    retokenized: int = 0
    missing: int = 0
    """Successful calls without token ids."""
    drifted: int = 0
    calls_in_ended_attempts: int = 0
    """Calls of attempts that are not their rollout's final, succeeded attempt."""
    template_rewrites: int = 0
    unnamed_calls: int = 0
    named_calls: int = 0
    reconciled_gateway_calls: int = 0
    """Gateway calls of the final attempts of rollouts that made any (what LightningRL reconciles)."""
    lightningrl_calls: int = 0
    """LightningRL's calls of those attempts: equal to :attr:`reconciled_gateway_calls` by construction."""
    unjoined_llm_spans: int = 0
    """Framework LLM spans of those attempts that joined no gateway call (kept as operations)."""
    unreconciled_rollouts: dict[str, str] = field(default_factory=dict)
    """Rollout id -> why reconciliation flagged it (LightningRL does not train it)."""
    reconciliation: dict[str, dict[str, int]] = field(default_factory=dict)
    """Per rollout: ``gateway_calls``, ``lightningrl_calls``, ``unjoined_llm_spans``."""
    adapters: dict[str, int] = field(default_factory=dict)
    """Adapter name -> attempts it instrumented."""
    adapter_failures: dict[str, int] = field(default_factory=dict)
    """``"name: why"`` -> attempts."""
    groups: int = 0
    """Rollout groups among the training rollouts (all rollouts when none is a training one)."""
    singleton_groups: int = 0
    groups_trained: bool = True
    """Whether :attr:`groups` counts training rollouts (False: only held-out ones were selected)."""
    upstream_forwarded: int | None = None
    """Calls the gateway sent upstream (only when the gateway's counters are known)."""
    spans_dropped: int | None = None
    quarantined: dict[str, int] = field(default_factory=dict)
    """Rollouts whose stored reward values LightningRL would quarantine, by reason."""
    quarantine_examples: list[str] = field(default_factory=list)
    """Up to three ``"rollout: detail"`` examples."""


@dataclass
class DoctorReport:
    """Counts and findings; :meth:`render` prints them."""

    counts: CaptureCounts
    findings: list[Finding]
    """Capture findings, then each run's training-health findings."""
    runs: list[RunHealth] = field(default_factory=list)
    """Training health of each run among the rollouts."""

    @property
    def capture_ok(self) -> bool:
        """No capture error or warning."""
        return not any(f.severity in ("error", "warning") for f in self.findings if f.run_id is None)

    @property
    def ok(self) -> bool:
        """No error or warning (capture or training health)."""
        return not any(f.severity in ("error", "warning") for f in self.findings)

    def finding(self, code: str) -> Finding | None:
        return next((f for f in self.findings if f.code == code), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "capture_ok": self.capture_ok,
            "counts": asdict(self.counts),
            "findings": [asdict(f) for f in self.findings],
            "runs": [r.to_dict() for r in self.runs],
        }

    def render(self) -> str:
        c = self.counts
        status = ", ".join(f"{n} {s}" for s, n in sorted(c.rollouts_by_status.items()))
        lines = [
            f"rollouts: {c.rollouts} ({status or 'none'})",
            f"LLM calls in the store: {c.calls} ({c.calls_ok} answered, {c.calls_failed} failed upstream)"
            + (f"; the gateway forwarded {c.upstream_forwarded}" if c.upstream_forwarded is not None else ""),
            f"token ids of answered calls: {c.exact} exact, {c.retokenized} retokenized ({c.drifted} drifted), "
            f"{c.missing} missing",
        ]
        if c.reconciliation:
            lines.append(
                f"reconciliation (final attempts): {c.reconciled_gateway_calls} gateway calls, {c.lightningrl_calls} "
                f"LightningRL calls, {c.unjoined_llm_spans} unjoined framework LLM spans (operations), "
                f"{len(c.unreconciled_rollouts)} rollouts flagged"
            )
        if c.adapters or c.adapter_failures:
            active = ", ".join(sorted(c.adapters)) or "none"
            lines.append(f"adapters: {active}" + (f"; {len(c.adapter_failures)} failed" if c.adapter_failures else ""))
        for f in self.findings:
            if f.run_id is None:
                lines.append(f"{f.severity.upper()} {f.code} ({f.count}): {f.message}. Fix: {f.fix}")
        lines.append("capture ok" if self.capture_ok else "capture NOT ok: see the findings above")
        for run in self.runs:
            lines += run.lines()
            for f in run.findings:
                lines.append(f"{f.severity.upper()} {f.code} ({f.count}): {f.message}. Fix: {f.fix}")
            warned = sum(f.severity != "info" for f in run.findings)
            lines.append(
                f"training health of {run.run_id}: "
                + (f"{warned} warning{'s' if warned > 1 else ''}" if warned else "ok")
            )
        return "\n".join(lines)


def _messages(span: t.Span) -> list[tuple[str, str]]:
    raw = span.attributes.get(semconv.GEN_AI_INPUT_MESSAGES)
    try:
        messages = json.loads(raw) if isinstance(raw, str) else []
    except ValueError:
        return []
    out = []
    for m in messages if isinstance(messages, list) else []:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):
            content = "".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
        out.append((str(m.get("role")) if isinstance(m, dict) else "", str(content or "")))
    return out


def _template_rewrites(calls: Sequence[t.Span]) -> int:
    """Calls that continue an earlier call's conversation whose prompt ids do not extend its ids."""
    seen: list[tuple[list[tuple[str, str]], list[int]]] = []  # (messages, prompt + response ids)
    rewrites = 0
    for span in calls:
        a = span.attributes
        prompt, response = a.get(semconv.PROMPT_TOKEN_IDS), a.get(semconv.RESPONSE_TOKEN_IDS)
        if not isinstance(prompt, list) or not isinstance(response, list):
            continue
        messages = _messages(span)
        for earlier, ids in reversed(seen):
            n = len(earlier)
            if len(messages) > n and messages[:n] == earlier and messages[n][0] == "assistant":
                if prompt[: len(ids)] != ids:
                    rewrites += 1
                break
        seen.append((messages, prompt + response))
    return rewrites


def diagnose(
    rollouts: Sequence[t.Rollout],
    spans: Mapping[str, Sequence[t.Span]],
    *,
    gateway_stats: Mapping[str, Any] | None = None,
) -> DoctorReport:
    """The report for ``rollouts`` and their spans of **every** attempt (``query_spans(ids)``).

    ``gateway_stats`` (``Gateway.stats()``) adds the upstream's side: calls forwarded vs recorded.
    """

    c = CaptureCounts(rollouts=len(rollouts))
    c.rollouts_by_status = dict(Counter(r.status.value for r in rollouts))
    no_calls = 0
    for rollout in rollouts:
        own = list(spans.get(rollout.rollout_id, ()))
        calls = [s for s in own if is_gateway_call(s)]
        if not calls:
            no_calls += rollout.status is t.RolloutStatus.SUCCEEDED
        final = rollout.current_attempt_id if rollout.status is t.RolloutStatus.SUCCEEDED else None
        by_attempt: dict[str | None, list[t.Span]] = {}
        for s in calls:
            by_attempt.setdefault(s.attempt_id, []).append(s)
            c.calls += 1
            if s.attempt_id != final:
                c.calls_in_ended_attempts += 1
            if s.status.code is t.StatusCode.ERROR:
                c.calls_failed += 1
                kind = str(s.attributes.get("agentbolt.llm.upstream_error") or s.attributes.get(semconv.ERROR_TYPE))
                c.failed_by_type[kind] = c.failed_by_type.get(kind, 0) + 1
                continue
            c.calls_ok += 1
            source = s.attributes.get(semconv.TOKEN_SOURCE)
            if source == semconv.TOKEN_SOURCE_EXACT:
                c.exact += 1
            elif source == semconv.TOKEN_SOURCE_RETOKENIZED:
                c.retokenized += 1
                c.drifted += bool(s.attributes.get(semconv.TOKEN_DRIFT))
            else:
                c.missing += 1
        for attempt_calls in by_attempt.values():
            c.template_rewrites += _template_rewrites(attempt_calls)
        for s in own:
            if s.name == semconv.SPAN_CAPTURE:
                for name in s.attributes.get(semconv.CAPTURE_ADAPTERS) or ():
                    c.adapters[str(name)] = c.adapters.get(str(name), 0) + 1
                for why in s.attributes.get(semconv.CAPTURE_ADAPTER_FAILURES) or ():
                    c.adapter_failures[str(why)] = c.adapter_failures.get(str(why), 0) + 1
        if rollout.current_attempt_id is None or not (calls or rollout.final_reward is not None):
            continue
        # One extraction, the one training runs: its quarantine (a stored reward value training
        # refuses), its reconciliation and its calls' agent names.
        episode = extract_episode(rollout, own)
        why = episode.quarantine
        if why is not None:
            c.quarantined[why[0]] = c.quarantined.get(why[0], 0) + 1
            if len(c.quarantine_examples) < 3:
                c.quarantine_examples.append(f"{rollout.rollout_id}: {why[1]}")
        if calls:
            rec = episode.reconciliation
            if rec is not None:
                c.reconciled_gateway_calls += rec.gateway_calls
                c.lightningrl_calls += rec.calls
                c.unjoined_llm_spans += rec.unjoined_llm_spans
                c.reconciliation[rollout.rollout_id] = {
                    "gateway_calls": rec.gateway_calls,
                    "lightningrl_calls": rec.calls,
                    "unjoined_llm_spans": rec.unjoined_llm_spans,
                }
                if rec.flag is not None:
                    c.unreconciled_rollouts[rollout.rollout_id] = rec.flag
            for call in episode.calls:
                if call.agent_name:
                    c.named_calls += 1
                else:
                    c.unnamed_calls += 1
    trained = [r for r in rollouts if r.mode is t.RolloutMode.TRAIN]
    c.groups_trained = bool(trained) or not rollouts
    groups = Counter(r.group_id or r.rollout_id for r in (trained or rollouts))
    c.groups, c.singleton_groups = len(groups), sum(1 for n in groups.values() if n == 1)
    if gateway_stats is not None:
        c.upstream_forwarded = int(gateway_stats.get("forwarded", 0))
        c.spans_dropped = int(gateway_stats.get("spans_dropped", 0))
    by_run: dict[str, list[t.Rollout]] = {}
    for r in rollouts:
        if r.run_id is not None and r.step is not None:
            by_run.setdefault(r.run_id, []).append(r)
    runs = [
        diagnose_run(run_id, members, spans)
        for run_id, members in by_run.items()
        if any(r.mode is t.RolloutMode.TRAIN for r in members)
    ]
    findings = _findings(c, no_calls) + [f for run in runs for f in run.findings]
    return DoctorReport(c, findings, runs)


def _findings(c: CaptureCounts, no_calls: int) -> list[Finding]:
    out: list[Finding] = []
    if c.upstream_forwarded is not None and c.upstream_forwarded > c.calls:
        out.append(
            Finding(
                "not_recorded",
                "error",
                c.upstream_forwarded - c.calls,
                f"the gateway forwarded {c.upstream_forwarded} calls upstream but the store holds {c.calls} call spans"
                + (f" ({c.spans_dropped} dropped by the gateway)" if c.spans_dropped else ""),
                "keep the store reachable from the gateway (its span buffer drops the oldest when full), and do not "
                "purge rollouts while they run",
            )
        )
    if no_calls:
        out.append(
            Finding(
                "no_calls",
                "error",
                no_calls,
                "succeeded rollouts made no LLM call through the gateway",
                "build the agent's client from resources.llm.base_url (the rollout's gateway URL), not a fixed URL",
            )
        )
    for name, n in sorted(c.adapter_failures.items()):
        out.append(
            Finding(
                "adapter_failed",
                "error",
                n,
                f"adapter failed to instrument on {n} attempts ({name}); it recorded no agents or tools there",
                "fix what the adapter's message says, in the processes that run agents",
            )
        )
    if c.missing:
        out.append(
            Finding(
                "missing_token_ids",
                "error",
                c.missing,
                f"{c.missing} answered calls have no token ids: the backend returned none",
                "use a backend that returns token ids (vLLM, agentbolt's torch policy server), or "
                "Trainer(capture=CaptureOptions(token_ids='retokenize', tokenizer=<the policy's tokenizer>))",
            )
        )
    if c.drifted:
        out.append(
            Finding(
                "token_drift",
                "warning",
                c.drifted,
                f"{c.drifted} of {c.retokenized} retokenized calls disagree with the backend's token counts or text "
                "(agentbolt.llm.token_drift says how); LightningRL excludes them",
                "pass the tokenizer (and chat template) of the model the backend serves, or use exact token ids",
            )
        )
    if c.retokenized > c.drifted:
        out.append(
            Finding(
                "retokenized",
                "info",
                c.retokenized - c.drifted,
                "calls have ids rebuilt from text that match the backend's counts",
                "LightningRL trains on them only with allow_retokenized=True; exact ids are safer",
            )
        )
    if c.calls_failed:
        kinds = ", ".join(f"{k} x{n}" for k, n in sorted(c.failed_by_type.items()))
        out.append(
            Finding(
                "failed_calls",
                "warning",
                c.calls_failed,
                f"{c.calls_failed} calls failed upstream ({kinds}); they are failures, not missing ids",
                "check the inference backend (reachable, healthy, fast enough for request_timeout_s)",
            )
        )
    if c.calls_in_ended_attempts:
        out.append(
            Finding(
                "calls_in_ended_attempts",
                "info",
                c.calls_in_ended_attempts,
                "calls belong to attempts that failed, timed out or were retried; they are never trained on",
                "see the failed rollouts' errors; raise timeout_s if attempts time out",
            )
        )
    if c.template_rewrites:
        out.append(
            Finding(
                "template_rewrite",
                "warning",
                c.template_rewrites,
                "later calls continue an earlier conversation but their prompt ids do not start with the earlier "
                "prompt + reply ids (the chat template or the agent re-rendered history): those turns cannot merge "
                "into one sequence and train as separate transitions",
                "send earlier replies back unchanged (same text and tool-call arguments), or use a chat template that "
                "renders history as generated",
            )
        )
    if c.unreconciled_rollouts:
        examples = "; ".join(f"{rid}: {why}" for rid, why in list(c.unreconciled_rollouts.items())[:3])
        out.append(
            Finding(
                "unreconciled",
                "error",
                len(c.unreconciled_rollouts),
                f"{len(c.unreconciled_rollouts)} rollouts are flagged by reconciliation and will not be trained "
                f"(e.g. {examples})",
                "build every model client the agent uses from resources.llm.base_url, so each call passes the "
                "gateway; if the framework records its calls without a response id, traceparent or input messages, "
                "name them with CaptureOptions(agent_names=...) and check the adapter; LightningRLConfig("
                "unreconciled='train') trains flagged rollouts anyway",
            )
        )
    if c.unjoined_llm_spans:
        out.append(
            Finding(
                "unjoined_llm_spans",
                "info",
                c.unjoined_llm_spans,
                f"{c.unjoined_llm_spans} framework LLM spans joined no gateway call (e.g. a framework's request "
                "preparation tagged as an LLM span); they are kept as operations, never calls",
                "nothing to do unless a rollout is flagged (unreconciled): LightningRL's calls are the gateway's",
            )
        )
    if c.unnamed_calls:
        framework = bool(c.adapters) and c.named_calls > 0
        out.append(
            Finding(
                "unnamed_calls",
                "warning" if framework else "info",
                c.unnamed_calls,
                f"{c.unnamed_calls} calls have no agent name"
                + (" although an adapter named other calls" if framework else ""),
                "name roles with Trainer(capture=CaptureOptions(agent_names={'planner': 'system prompt text', ...})) or the "
                "X-Agentbolt-Agent-Name header, so agent_match can select them",
            )
        )
    if c.quarantined:
        n = sum(c.quarantined.values())
        reasons = ", ".join(f"{k} x{v}" for k, v in sorted(c.quarantined.items()))
        out.append(
            Finding(
                "quarantined_values",
                "warning",
                n,
                f"{n} rollouts hold a reward value training refuses ({reasons}): LightningRL quarantines them "
                f"and trains the rest (e.g. {'; '.join(c.quarantine_examples)})",
                QUARANTINE_FIX,
            )
        )
    if c.singleton_groups:
        out.append(
            Finding(
                "singleton_groups",
                "info",
                c.singleton_groups,
                f"{c.singleton_groups} of {c.groups} training rollout groups have one rollout: their GRPO/RLOO "
                "advantages are 0"
                if c.groups_trained
                else f"{c.singleton_groups} of {c.groups} rollout groups (held-out: never trained) have one rollout: "
                "trained with GRPO/RLOO, their advantages would be 0",
                "sample each task several times (group_size / n_samples >= 2) before training with group advantages",
            )
        )
    return out


async def doctor(
    store: Store,
    *,
    run: str | None = None,
    rollout_ids: Sequence[str] | None = None,
    since: float | None = None,
    gateway_stats: Mapping[str, Any] | None = None,
) -> DoctorReport:
    """:func:`diagnose` the rollouts of a store: given ids, a run (rollout id prefix), those
    created since a unix time, or all."""
    if rollout_ids is not None:
        rollouts = await store.get_rollouts(list(rollout_ids))
    else:
        rollouts, cursor = [], None
        while True:
            page = await store.query_rollouts(limit=1000, cursor=cursor)
            rollouts += page.items
            cursor = page.next_cursor
            if not cursor:
                break
    if run is not None:
        rollouts = [r for r in rollouts if r.rollout_id.startswith(run)]
    if since is not None:
        rollouts = [r for r in rollouts if r.created_at >= since]
    spans: dict[str, list[t.Span]] = {}
    ids = [r.rollout_id for r in rollouts]
    for i in range(0, len(ids), 200):
        spans.update(await store.query_spans(ids[i : i + 200]))
    report = diagnose(rollouts, spans, gateway_stats=gateway_stats)
    for run_id in sorted({r.run_id for r in rollouts if r.run_id is not None}):
        try:
            counts = quarantined_in_metrics(await store.get_run_metrics(run_id))
        except NotFoundError:  # a run without a record (rollouts enqueued by hand)
            continue
        finding = quarantine_finding(run_id, counts)
        if finding is not None:
            report.findings.append(finding)
            for health in report.runs:
                if health.run_id == run_id:
                    health.findings.append(finding)
    return report
