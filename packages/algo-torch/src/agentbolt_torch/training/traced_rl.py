"""``torch-traced-rl``: RL updates over a stored run of traced rollouts, nothing sampled.

A run of traced rollouts (an instrumented agent's OTLP traces, ingested by ``agentbolt ingest``
or :mod:`agentbolt.traces`, with rewards from feedback, judges or a scoring function) is read
from the store in pages; LightningRL (the one producer of training rows) turns each batch of
rewarded rollouts into rows, an existing advantage estimator compares them, and the torch
updater of ``torch-grpo`` updates the policy. Held-out tasks are measured before and after
through the agent, as ``fit([], val)`` does for SFT on demonstrations:

    rl = TorchTracedRL("smollm2", traces="prod-traces", lightningrl={"allow_retokenized": True})
    result = Trainer(agent, rl, store="sqlite:///runs.db").fit([], val)
    print(result.traces.lines())

What it trains on, and what it refuses:

- Traced calls carry token ids rebuilt by retokenization and no behaviour logprobs. Training on
  them must be asked for (``LightningRLConfig(allow_retokenized=True)``); the updater then
  re-scores each trajectory with the current policy (first PPO ratio 1): not an off-policy
  correction, so biased when production served another model (``docs/traces.md``). Off-policy
  correction (``rollout_is`` / ``rollout_rs``) is refused: it needs the missing logprobs.
- A rollout without a final reward is skipped and counted, never trained as if it scored 0
  (``missing_reward="fill"`` is refused).
- Advantages: a traced rollout is usually the only one of its task, and a group of one has
  advantage 0. So the rollouts are grouped by ``group_by``: ``"batch"`` (default: every
  rollout of a step's batch in one group, a batch baseline) or ``"input"`` (traces whose
  first call asked the same messages form a group; batches hold whole groups). The default
  estimator is ``rloo`` (each rollout's baseline is the mean reward of the *other* rollouts of
  its group: unbiased, no division by a small batch's standard deviation); any registered one
  can be named with ``lightningrl={"advantage": ...}``.

The run's report (:class:`TracedRunReport`, ``result.traces``) counts every call: trained, or
left out with LightningRL's reason (``token_drift``, ``missing_reward``, ...).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import statistics
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from agentbolt import types as t
from agentbolt.algorithm import AlgorithmContext
from agentbolt.errors import NotFoundError, UserError
from agentbolt.store import RolloutSearch, Store

from .algorithm import TorchGRPO, TorchGRPOResult

__all__ = ["GroupBy", "TorchTracedRL", "TorchTracedRLResult", "TracedRunReport", "read_traced_run"]

log = logging.getLogger(__name__)

GroupBy = Literal["batch", "input"]

PAGE_SIZE = 256
"""Rollouts read from the store at a time (with their spans) while the run is counted."""

_REFUSED_CORRECTION = (
    "{name}: off-policy correction (rollout_is={rollout_is!r}, rollout_rs={rollout_rs!r}) needs the "
    "behaviour policy's logprobs, and traced rollouts have no behaviour (sampling) logprobs: the "
    "deployment's server did not report them. Leave rollout_is and rollout_rs unset (the update then "
    "re-scores each trajectory with the current policy; docs/traces.md says when that is sound), or "
    "train with SFT on the best traces (TorchSFT(demonstrations=demonstrations_from_spans(...)))."
)


@dataclass
class TracedRunReport:
    """What a stored run of traced rollouts holds for RL, counted before any update.

    Invariants: ``calls == trained_calls + sum(excluded.values())`` and ``rollouts == rewarded +
    skipped_no_reward``; each epoch trains ``trained_calls`` rows (``merge=False``).
    """

    run_id: str
    rollouts: int = 0
    """Training rollouts of the run read from the store (held-out ones are never read)."""
    rewarded: int = 0
    """Rollouts with a final reward (by LightningRL's precedence rule)."""
    skipped_no_reward: int = 0
    """Rollouts without one: skipped (their calls counted as ``missing_reward``), never trained as 0."""
    trainable: int = 0
    """Rewarded rollouts with at least one call LightningRL keeps: what the steps draw from."""
    calls: int = 0
    """LLM calls of the run's rollouts."""
    trained_calls: int = 0
    """Calls LightningRL turns into training rows (calls of rewarded rollouts that it kept)."""
    excluded: dict[str, int] = field(default_factory=dict)
    """Calls left out, by LightningRL's reason (``token_drift``, ``missing_reward``, ``retokenized``, ...)."""
    groups: int = 0
    """Advantage groups among the trainable rollouts (``group_by="input"``; 0 with ``"batch"``)."""
    singleton_groups: int = 0
    """Of those, groups of one rollout (advantage 0: nothing to compare with)."""

    def lines(self) -> str:
        """The report as a few lines of text."""
        excluded = ", ".join(f"{n} {why}" for why, n in sorted(self.excluded.items())) or "none"
        text = (
            f"run {self.run_id}: {self.rollouts} traced rollouts, {self.rewarded} with a final reward "
            f"({self.skipped_no_reward} without: skipped), {self.trainable} trainable\n"
            f"{self.calls} LLM calls: {self.trained_calls} trained, excluded: {excluded}"
        )
        if self.groups:
            text += f"\n{self.groups} groups by input ({self.singleton_groups} of one rollout: advantage 0)"
        return text


@dataclass
class TorchTracedRLResult(TorchGRPOResult):
    """What a ``torch-traced-rl`` run did: ``torch-grpo``'s result and the run's :class:`TracedRunReport`."""

    traces: TracedRunReport | None = None
    trained_rows: int = 0
    """Rows the updates trained on, over all steps."""


@dataclass
class _TracedRun:
    """The counted run: its report and the training items (tuples of rollout ids: one group)."""

    report: TracedRunReport
    items: list[tuple[str, ...]]


def _input_key(rollout: t.Rollout, spans: Sequence[t.Span]) -> str:
    """The task a traced rollout answered: its ``task_id`` when it has one, else the messages of
    its first call (what the agent was asked)."""
    from agentbolt.runs.chat_calls import rollout_chat_calls

    if rollout.task_id:
        return f"task:{rollout.task_id}"
    calls = rollout_chat_calls(rollout, spans)
    if not calls:
        return f"rollout:{rollout.rollout_id}"
    return "messages:" + json.dumps(calls[0].messages, sort_keys=True, default=str)


async def read_traced_run(
    store: Store, run_id: str, lrl: Any, *, group_by: GroupBy = "batch", page_size: int = PAGE_SIZE
) -> tuple[TracedRunReport, list[tuple[str, ...]]]:
    """Count a stored run for RL: read its training rollouts (held-out ones never train)
    ``page_size`` at a time with their final
    attempts' spans, run LightningRL's per-rollout step (``lrl.collect``) over each page, and
    return the report and the training items (groups of rollout ids: one rollout each with
    ``group_by="batch"``, the rollouts sharing an input with ``"input"``).

    Raises:
        UserError: the run does not exist, or has no rollout to train on (the message says why).
    """
    try:
        await store.get_run(run_id)
    except NotFoundError:
        raise UserError(
            f"no run {run_id!r} in the store: name a run of traced rollouts (`agentbolt runs list --store URL`; "
            "`agentbolt ingest --run NAME` creates one)"
        ) from None
    report = TracedRunReport(run_id=run_id)
    excluded: Counter[str] = Counter()
    by_input: dict[str, list[str]] = {}
    example = ""  # LightningRL's account of the first page with exclusions: reasons, hints, examples
    offset = 0
    while True:
        search = RolloutSearch(run_id=run_id, mode=t.RolloutMode.TRAIN, limit=page_size, offset=offset)
        page = await store.search_rollouts(search)
        if not page.items:
            break
        offset += len(page.items)
        ids = [r.rollout_id for r in page.items]
        spans = await store.query_spans(ids, latest_attempt_only=True)
        batch = lrl.collect(page.items, spans)
        report.rollouts += len(page.items)
        report.calls += batch.report.calls
        report.trained_calls += batch.report.trained_calls
        excluded.update(batch.report.excluded)
        if batch.report.excluded and not example:
            example = f"LightningRL on rollouts {offset - len(page.items) + 1}-{offset}:\n{batch.report.summary()}\n"
        rollouts = {r.rollout_id: r for r in page.items}
        for ro in batch.report.per_rollout:
            if ro.final_reward is None:
                report.skipped_no_reward += 1
                continue
            report.rewarded += 1
            if ro.trained:
                report.trainable += 1
                key = (
                    _input_key(rollouts[ro.rollout_id], spans.get(ro.rollout_id, []))
                    if group_by == "input"
                    else ro.rollout_id
                )
                by_input.setdefault(key, []).append(ro.rollout_id)
        log.info("%s: counted %d of %d rollouts", run_id, offset, page.total)
        if len(page.items) < page_size:
            break
    report.excluded = dict(excluded)
    if group_by == "input":
        report.groups = len(by_input)
        report.singleton_groups = sum(len(ids) == 1 for ids in by_input.values())
    if not report.trainable:
        why = (
            "it has no rollout"
            if not report.rollouts
            else f"none of its {report.rollouts} rollouts has a final reward"
            if not report.rewarded
            else f"LightningRL keeps no call of its {report.rewarded} rewarded rollouts"
        )
        raise UserError(
            f"run {run_id!r} has nothing to train on: {why}.\n{report.lines()}\n{example}"
            "Attach rewards (feedback by trace id, a judge or a scoring function: docs/traces.md) "
            "or fix what the exclusions name."
        )
    return report, [tuple(ids) for ids in by_input.values()]


class TorchTracedRL(TorchGRPO):
    """RL on a stored run of traced rollouts (offline: nothing is sampled for training).

    Takes :class:`~agentbolt_torch.training.algorithm.TorchGRPO`'s arguments (model, steps,
    batch_size, evaluation, lightningrl, update, policy, generation, output, seed;
    ``output.out_dir`` defaults to ``runs/torch-traced-rl``; ``group_size`` and ``sampling`` only
    shape the held-out evaluation), and:

    Args:
        traces: the run of traced rollouts to train on (its ``run_id``).
        traces_store: the store URL holding that run (``None``: the Trainer's store).
        group_by: how rollouts are grouped for the advantage: ``"batch"`` (each step's batch is
            one group: a batch baseline) or ``"input"`` (traces whose first call asked the same
            messages; batches hold ``batch_size`` whole groups).

    ``lightningrl`` must allow retokenized ids (``{"allow_retokenized": True}``); its advantage
    estimator defaults to ``rloo`` here. Each step takes ``batch_size`` items (rollouts or input
    groups) in shuffled epochs over the run's trainable rollouts.
    """

    name = "torch-traced-rl"
    asynchronous = False
    supports_policies = False

    def __init__(
        self,
        model: str = "smollm2",
        *,
        traces: str,
        traces_store: str | None = None,
        group_by: GroupBy = "batch",
        lightningrl: Any = None,
        **options: Any,
    ) -> None:
        from agentbolt.lightningrl import LightningRLConfig

        if not traces:
            raise UserError(f"{self.name}: traces= names the run of traced rollouts to train on")
        if group_by not in ("batch", "input"):
            raise UserError(f"{self.name}: group_by must be 'batch' or 'input', got {group_by!r}")
        config = LightningRLConfig.from_value(lightningrl)
        if not config.allow_retokenized:
            raise UserError(
                f"{self.name}: traced calls have token ids rebuilt by retokenization, which LightningRL "
                "trains on only when asked: pass lightningrl={'allow_retokenized': True} (the update then "
                "re-scores each trajectory with the current policy; read the bias caveat in docs/traces.md)"
            )
        if config.rollout_is is not None or config.rollout_rs is not None:
            raise UserError(
                _REFUSED_CORRECTION.format(name=self.name, rollout_is=config.rollout_is, rollout_rs=config.rollout_rs)
            )
        if config.missing_reward == "fill":
            raise UserError(
                f"{self.name}: missing_reward='fill' would train traces that have no reward as if they had "
                "one; traced rollouts without a final reward are skipped and counted (leave missing_reward unset)"
            )
        if config.max_staleness is not None:
            raise UserError(f"{self.name}: nothing is sampled, so max_staleness does not apply (leave it unset)")
        if "advantage" not in config.model_fields_set:
            config = config.replace(advantage="rloo")
        if group_by == "batch" and options.get("batch_size", 8) < 2:
            raise UserError(
                f"{self.name}: group_by='batch' compares the rollouts of a batch, so a batch of one has "
                "advantage 0: use batch_size >= 2"
            )
        options.setdefault("output", {})
        if isinstance(options["output"], Mapping):
            options["output"] = {"out_dir": f"runs/{self.name}", **options["output"]}
        super().__init__(model, lightningrl=config, **options)
        self.traces = traces
        self.traces_store = traces_store
        self.group_by: GroupBy = group_by
        self._source: Store | None = None
        self._groups: dict[str, str] = {}
        self._items: list[tuple[str, ...]] = []
        self._trained_rows = 0

    _step_tag = "traced"
    _step_label = "traced RL step"

    async def run(self, ctx: AlgorithmContext, train: Sequence[t.Task], val: Sequence[t.Task]) -> TorchTracedRLResult:
        from agentbolt.lightningrl import LightningRL
        from agentbolt.store import open_store

        if train:
            raise UserError(
                f"{self.name} trains on the stored run {self.traces!r}, not on tasks: call fit([], val) "
                "(val: held-out tasks measured before and after)"
            )
        if not ctx.policies.is_shared:
            raise UserError(f"{self.name}: policies by role are not supported; train one shared policy")
        source = open_store(self.traces_store) if self.traces_store is not None else ctx.store
        try:
            report, items = await read_traced_run(
                source, self.traces, LightningRL(self.lightningrl), group_by=self.group_by
            )
            log.info("%s", report.lines())
            self._source, self._items, self._trained_rows = source, items, 0
            self._groups = {rid: f"input{i}" for i, ids in enumerate(items) for rid in ids}
            result = await super().run(ctx, train, val)
        finally:
            self._source = None
            if self.traces_store is not None:
                await source.close()
        fields = {f.name: getattr(result, f.name) for f in dataclasses.fields(result)}
        return TorchTracedRLResult(**fields, traces=report, trained_rows=self._trained_rows)

    def _training_items(self, train: Sequence[t.Task]) -> Sequence[Any]:
        """The run's trainable rollouts (groups of rollout ids), counted by :meth:`run`."""
        return self._items

    async def _step_transitions(
        self, ctx: AlgorithmContext, policy: Any, step: int, batch: Sequence[Any], lrl: Any, *, first: bool
    ) -> tuple[list[Any] | None, dict[str, float]]:
        """The batch's rollouts and spans read from the store, grouped for the advantage, made
        rows by LightningRL (:meth:`TorchGRPO._transitions_to_train`)."""
        assert self._source is not None
        started = time.monotonic()
        ids = [rollout_id for item in batch for rollout_id in item]
        rollouts = await self._source.get_rollouts(ids)
        spans = await self._source.query_spans(ids, latest_attempt_only=True)
        group = (lambda r: f"batch{step}") if self.group_by == "batch" else (lambda r: self._groups[r.rollout_id])
        rollouts = [r.model_copy(update={"group_id": group(r)}) for r in rollouts]
        rewards = [r.final_reward for r in rollouts if r.final_reward is not None]
        values = {
            "train/reward": statistics.fmean(rewards) if rewards else 0.0,
            "train/accuracy": self._accuracy(rollouts),
            "train/rollouts": float(len(rollouts)),
            "time/read_s": time.monotonic() - started,
        }
        chosen = self._transitions_to_train(step, rollouts, spans, lrl, first=first, policy_version=policy.version)
        if chosen is None:
            return None, values
        rows, extra = chosen
        self._trained_rows += len(rows)
        return rows, {**values, **extra}
