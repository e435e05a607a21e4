"""``agentbolt export``: a run's rollouts as training data or interchange files.

agentbolt export --run RUN --format jsonl|otlp|sft-jsonl|chat-jsonl|atif [--mode train|val|all]
                 [--min-reward R] [--best-k K] [--source gateway|traces|all] --store URL [--output FILE]

Formats: ``jsonl`` (LightningRL transitions), ``otlp`` (the spans as OTLP/JSON), ``sft-jsonl``
(transitions with token ids and labels: :mod:`agentbolt.runs.export`), ``chat-jsonl`` (one chat
call per line, messages + tools: :func:`agentbolt.runs.chat_calls.chat_record`) and ``atif`` (one
ATIF v1.8 trajectory per line: :mod:`agentbolt.runs.atif_export`). ``chat-jsonl`` and ``atif``
need no token ids, so traced rollouts (ingested from OTLP, ids retokenized or missing) export
like any other. The command only reads the store; what it wrote and left out goes to stderr.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from .. import types as t
from ..json_text import json_bytes
from ..store.run_records import RolloutSearch
from .options import ReadStoreOption, StoreTokenOption
from .runs import run_in_store

__all__ = ["ExportCounts", "ExportFormat", "ExportMode", "export", "export_run"]


class ExportFormat(StrEnum):
    jsonl = "jsonl"
    otlp = "otlp"
    sft_jsonl = "sft-jsonl"
    chat_jsonl = "chat-jsonl"
    atif = "atif"


class ExportMode(StrEnum):
    train = "train"
    val = "val"
    all = "all"


class ExportSource(StrEnum):
    gateway = "gateway"
    traces = "traces"
    all = "all"


_CHAT_FORMATS = (ExportFormat.chat_jsonl, ExportFormat.atif)


@dataclass
class ExportCounts:
    """What :func:`export_run` wrote, per rollout mode, and what it left out and why."""

    rollouts: Counter[str] = field(default_factory=Counter)
    """Rollouts exported, by mode (``train`` / ``val``)."""
    records: Counter[str] = field(default_factory=Counter)
    """Records written (transitions, spans, chat calls or trajectories), by the mode of their rollout."""
    left_out: Counter[str] = field(default_factory=Counter)
    """Finished rollouts of the run that ``--mode`` left out, by mode."""
    filtered: Counter[str] = field(default_factory=Counter)
    """Rollouts of the selected mode left out by a filter, by reason."""

    @property
    def total(self) -> int:
        return sum(self.records.values())


_MODE_NAMES = {"train": "training", "val": "held-out (val)"}


async def _finished_rollouts(store: Any, run_id: str, mode: ExportMode, counts: ExportCounts) -> list[t.Rollout]:
    rollouts: list[t.Rollout] = []
    offset = 0
    while True:
        page = await store.search_rollouts(RolloutSearch(run_id=run_id, limit=1000, offset=offset))
        for r in page.items:
            if not r.status.is_final:
                continue
            if mode is ExportMode.all or r.mode.value == mode.value:
                rollouts.append(r)
            else:
                counts.left_out[r.mode.value] += 1
        offset += len(page.items)
        if not page.items or offset >= page.total:
            break
    rollouts.reverse()  # enqueue order
    return rollouts


async def export_run(
    store: Any,
    run_id: str,
    fmt: ExportFormat,
    write: Callable[[bytes], object],
    *,
    min_reward: float | None = None,
    mode: ExportMode = ExportMode.train,
    best_k: int | None = None,
    source: ExportSource = ExportSource.all,
) -> ExportCounts:
    """Write the run's finished rollouts of ``mode`` (training rollouts by default: held-out ones
    are never trained on and must not leak into training data) in ``fmt``.

    ``min_reward``: for ``sft-jsonl``, the transitions whose credit-assigned reward is at least
    this; for ``chat-jsonl`` / ``atif``, the rollouts whose final reward is. ``best_k``: at most
    this many rollouts per task, the highest final rewards. ``source``: rollouts whose calls the
    gateway recorded, or those known only from traces (:class:`~agentbolt.runs.chat_calls.RolloutSource`).
    """
    from ..runs.chat_calls import RolloutSource, rollout_chat_calls, rollout_source, select_rollouts
    from ..runs.views import lightningrl_for
    from ..store.server.otlp_json import spans_to_otlp_json

    run = await store.get_run(run_id)
    counts = ExportCounts()
    rollouts = await _finished_rollouts(store, run_id, mode, counts)
    chat_min = min_reward if fmt in _CHAT_FORMATS else None
    selected = select_rollouts(rollouts, min_reward=chat_min, best_k=best_k)
    if len(selected) < len(rollouts):
        below = select_rollouts(rollouts, min_reward=chat_min)
        if len(below) < len(rollouts):
            counts.filtered[f"final reward below {chat_min:g} or none"] += len(rollouts) - len(below)
        if len(selected) < len(below):
            counts.filtered[f"beyond the best {best_k} of their task"] += len(below) - len(selected)
    mode_of = {r.rollout_id: r.mode.value for r in selected}
    groups: dict[str, list[t.Rollout]] = {}
    for r in selected:
        groups.setdefault(r.group_id or r.rollout_id, []).append(r)
    lrl = lightningrl_for(run)
    batch: list[t.Rollout] = []
    for members in [*groups.values(), []]:
        batch.extend(members)
        if len(batch) < 200 and members:
            continue
        if not batch:
            break
        spans = await store.query_spans([r.rollout_id for r in batch], latest_attempt_only=True)
        calls: dict[str, list[Any]] = {}
        if source is not ExportSource.all or fmt in _CHAT_FORMATS:
            calls = {r.rollout_id: rollout_chat_calls(r, spans.get(r.rollout_id, [])) for r in batch}
            if source is not ExportSource.all:
                wanted = RolloutSource(source.value)
                other = [r for r in batch if rollout_source(r, calls[r.rollout_id]) is not wanted]
                if other:
                    counts.filtered[f"not from {source.value}"] += len(other)
                    batch = [r for r in batch if rollout_source(r, calls[r.rollout_id]) is wanted]
        for r in batch:
            counts.rollouts[r.mode.value] += 1
        if fmt is ExportFormat.otlp:
            flat = [s for r in batch for s in spans[r.rollout_id]]
            if flat:
                write(json_bytes(spans_to_otlp_json(flat)) + b"\n")
                for s in flat:
                    counts.records[mode_of[s.rollout_id or ""]] += 1
        elif fmt is ExportFormat.sft_jsonl:
            from ..runs.export import sft_records

            if batch:
                for record in sft_records(lrl.process(batch, spans).transitions, spans, min_reward=min_reward):
                    write(json_bytes(record) + b"\n")
                    counts.records[mode_of[record["rollout_id"]]] += 1
        elif fmt is ExportFormat.chat_jsonl:
            from ..runs.chat_calls import chat_record

            for r in batch:
                if not calls[r.rollout_id]:
                    counts.filtered["no LLM call with recorded messages"] += 1
                for call in calls[r.rollout_id]:
                    write(json_bytes(chat_record(r, call)) + b"\n")
                    counts.records[r.mode.value] += 1
        elif fmt is ExportFormat.atif:
            from ..runs.atif_export import rollout_trajectory

            for r in batch:
                if not calls[r.rollout_id]:
                    counts.filtered["no LLM call with recorded messages"] += 1
                    continue
                trajectory = rollout_trajectory(r, spans[r.rollout_id], run_id=run_id, calls=calls[r.rollout_id])
                write(json_bytes(trajectory.to_json_dict()) + b"\n")
                counts.records[r.mode.value] += 1
        elif batch:
            for x in lrl.process(batch, spans).transitions:
                write(x.model_dump_json().encode() + b"\n")
                counts.records[mode_of[x.rollout_id]] += 1
        batch = []
    return counts


_WHAT = {
    ExportFormat.otlp: "spans",
    ExportFormat.chat_jsonl: "chat calls",
    ExportFormat.atif: "ATIF trajectories",
}


def export(
    run: Annotated[str, typer.Option("--run", help="The run to export.")],
    store: ReadStoreOption,
    fmt: Annotated[
        ExportFormat,
        typer.Option(
            "--format",
            help="jsonl: one transition per line (token ids, logprobs, reward, advantage); otlp: the spans as "
            "OTLP/JSON, one ExportTraceServiceRequest per line; sft-jsonl: one transition per line in TRL's "
            "conversational format (messages) with input_ids/labels/masks; chat-jsonl: one LLM call per line, "
            "messages (request + reply) and tools, no token ids needed (traced rollouts too; torch-sft reads it "
            "with demonstrations_from_jsonl); atif: one ATIF v1.8 trajectory per line (Agent Trajectory "
            "Interchange Format; rewards in extra.reward).",
        ),
    ] = ExportFormat.jsonl,
    mode: Annotated[
        ExportMode,
        typer.Option(
            "--mode",
            help="Which rollouts: train (default: held-out rollouts never leak into training data), val (the "
            "held-out ones) or all.",
        ),
    ] = ExportMode.train,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="File to write (default: stdout).")] = None,
    store_token: StoreTokenOption = None,
    min_reward: Annotated[
        float | None,
        typer.Option(
            "--min-reward",
            help="sft-jsonl: only transitions whose reward is at least this; chat-jsonl and atif: only rollouts "
            "whose final reward is at least this (the best traces).",
        ),
    ] = None,
    best_k: Annotated[
        int | None,
        typer.Option(
            "--best-k", min=1, help="At most this many rollouts per task: those with the highest final reward."
        ),
    ] = None,
    source: Annotated[
        ExportSource,
        typer.Option(
            "--source",
            help="gateway: rollouts whose calls agentbolt's gateway recorded (exact token ids); traces: rollouts "
            "known only from instrumentation spans (e.g. ingested OTLP traces); all (default).",
        ),
    ] = ExportSource.all,
) -> None:
    """Export a run's rollouts of its training rollouts unless --mode says otherwise: as LightningRL
    transitions (made with the run's settings), spans, SFT data (sft-jsonl, chat-jsonl) or ATIF."""
    out = output.open("wb") if output is not None else sys.stdout.buffer
    try:
        counts = run_in_store(
            store,
            store_token,
            lambda s: export_run(
                s, run, fmt, out.write, min_reward=min_reward, mode=mode, best_k=best_k, source=source
            ),
        )
    finally:
        if output is not None:
            out.close()
        else:
            out.flush()
    what = _WHAT.get(fmt, "transitions")
    parts = [
        f"{counts.records[m]} from {counts.rollouts[m]} {_MODE_NAMES[m]} rollouts"
        for m in ("train", "val")
        if counts.rollouts[m] or (mode.value == m)
    ]
    left = [f"{n} {_MODE_NAMES[m]} rollouts left out" for m, n in sorted(counts.left_out.items()) if n]
    filtered = [f"{n} rollouts {why}" for why, n in counts.filtered.items() if n]
    typer.echo(
        f"exported {counts.total} {what} of {run}"
        + (f" to {output}" if output else "")
        + f": {'; '.join(parts)}"
        + (f" ({', '.join(left)}; --mode all includes them)" if left else "")
        + (f"; left out: {', '.join(filtered)}" if filtered else ""),
        err=True,
    )


def register(app: typer.Typer) -> None:
    """Add ``export`` to the ``agentbolt`` command line."""
    app.command("export")(export)
