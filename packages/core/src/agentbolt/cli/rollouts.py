"""``agentbolt rollouts list|show``: a store's rollouts, read as text.

agentbolt rollouts list [--run RUN] [--status ...] [--mode train|val] [--step N] [-q] [--wide]   -s URL
agentbolt rollouts show ROLLOUT [--wide]                                                         -s URL

``show`` leads with what a reader asks first: the question, the reply, the expected answer and
the verdict (:mod:`agentbolt.runs.answer`), then the group's other samples, the span tree and the
transitions LightningRL makes of the calls.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.tree import Tree

from .. import types as t
from ..store.run_records import RolloutSearch
from .options import QuietOption, ReadStoreOption, StoreTokenOption, WideOption
from .runs import run_in_store
from .tables import Column, show, table
from .tables import console as make_console

__all__ = ["rollouts_app"]

rollouts_app = typer.Typer(help="Rollouts of a store.", no_args_is_help=True, rich_markup_mode="markdown")

TEXT_CHARS = 600
"""``rollouts show`` prints at most this much of a question or reply (``--wide``: all of it)."""


def _num(x: Any) -> str:
    return "-" if x is None else (f"{x:.4g}" if isinstance(x, float) else str(x))


def _question(r: t.Rollout) -> str:
    from ..runs.answer import task_question

    return " ".join((task_question(r) or "").split())


@rollouts_app.command("list")
def rollouts_list(
    store: ReadStoreOption,
    run: Annotated[str | None, typer.Option("--run", help="Only rollouts of this run.")] = None,
    status: Annotated[
        list[t.RolloutStatus] | None,
        typer.Option(
            "--status",
            metavar="<status>",
            help="Any of these statuses (repeatable): " + ", ".join(s.value for s in t.RolloutStatus) + ".",
        ),
    ] = None,
    step: Annotated[int | None, typer.Option(help="Only this step.")] = None,
    mode: Annotated[
        t.RolloutMode | None, typer.Option(help="Only training (train) or held-out (val) rollouts.")
    ] = None,
    limit: Annotated[int, typer.Option(help="Most rollouts shown (newest first).")] = 50,
    wide: WideOption = False,
    quiet: QuietOption = False,
    store_token: StoreTokenOption = None,
) -> None:
    """List rollouts, newest first, with the question each was asked and its reward."""

    query = RolloutSearch(run_id=run, status=status or None, step=step, mode=mode, limit=limit)
    page = run_in_store(store, store_token, lambda s: s.search_rollouts(query), run=run)
    if quiet:
        for r in page.items:
            typer.echo(r.rollout_id)
        return
    columns = [
        Column("rollout", ident=True),
        Column("task", wide=True),
        Column("step", number=True),
        Column("mode"),
        Column("status", wide=True),
        Column("reward", number=True),
        Column("attempts", number=True, wide=True),
        Column("question"),
        Column("failure"),
    ]
    rows = [
        [
            r.rollout_id,
            r.task_id or "",
            "" if r.step is None else str(r.step),
            "held-out" if r.mode is t.RolloutMode.VAL else r.mode.value,
            r.status.value,
            _num(r.final_reward),
            str(r.attempt_count),
            _question(r),
            f"{r.error.kind.value}: {r.error.type}" if r.error else "",
        ]
        for r in page.items
    ]
    shown = len(page.items)
    title = (
        f"{page.total} rollouts" if shown == page.total else f"{shown} of {page.total} rollouts (newest; --limit N)"
    ) + (f" of {run}" if run else "")
    show(table(title, columns, rows, wide=wide, keep=("mode", "reward")), wide=wide)


@rollouts_app.command("show")
def rollouts_show(
    rollout_id: Annotated[str, typer.Argument(help="The rollout id (agentbolt rollouts list).")],
    store: ReadStoreOption,
    wide: WideOption = False,
    store_token: StoreTokenOption = None,
) -> None:
    """One rollout: the question, the reply, the expected answer and the verdict; the group's other
    samples with their rewards and advantages; the span tree and the transitions LightningRL makes
    of its calls."""
    from ..runs.views import trajectory

    v = run_in_store(store, store_token, lambda s: trajectory(s, rollout_id))
    r = v.rollout
    console = make_console()
    mode = "held-out" if v.held_out else r.mode.value
    console.print(
        f"[bold]{r.rollout_id}[/bold] [{r.status.value}] {mode} task {r.task_id} run {r.run_id or '-'} "
        f"step {'-' if r.step is None else r.step}",
        highlight=False,
    )
    if r.error:
        console.print(f"[red]{escape(f'{r.error.kind.value}: {r.error.type}: {r.error.message}')}[/red]")
    a = v.answer
    if a is not None:

        def text(value: str | None) -> str:
            if value is None:
                return "-"
            return value if wide or len(value) <= TEXT_CHARS else value[:TEXT_CHARS] + f"… (--wide: {len(value)} chars)"

        colour = "green" if a.correct else "red" if a.correct is False else "default"
        console.print(f"[bold]question[/bold]  {escape(text(a.question))}", highlight=False)
        console.print(f"[bold]reply[/bold]     {escape(text(a.reply))}", highlight=False)
        console.print(f"[bold]expected[/bold]  {escape(text(a.expected))}", highlight=False)
        console.print(
            f"[bold]verdict[/bold]   [{colour}]{escape(a.verdict)}[/{colour}]: {escape(a.parts_text())}",
            highlight=False,
        )
    others = [m for m in v.group if m.rollout_id != r.rollout_id]
    if others:
        rows = [
            [
                m.rollout_id,
                _num(m.reward),
                "-" if m.advantage is None else f"{m.advantage:+.3f}",
                "✓" if m.correct else "✗" if m.correct is False else "-",
            ]
            for m in others
        ]
        columns = [
            Column("rollout", ident=True),
            Column("reward", number=True),
            Column("advantage", number=True),
            Column("right"),
        ]
        show(table(f"the group's other samples ({len(others)})", columns, rows), to=console)
    tree = Tree("spans (latest attempt)")
    stack: list[tuple[int, Any]] = [(-1, tree)]
    for row in v.rows:
        while stack[-1][0] >= row.depth:
            stack.pop()
        dur = "open" if row.duration_ms is None else f"{row.duration_ms:.1f} ms"
        node = stack[-1][1].add(
            f"[cyan]{row.kind}[/cyan] {escape(row.span.name)} [dim]{escape(row.summary)} · {dur}[/dim]"
        )
        stack.append((row.depth, node))
    console.print(tree)
    columns = [
        Column("call", number=True),
        Column("agent"),
        Column("span", ident=True, wide=True),
        Column("prompt", number=True),
        Column("response", number=True),
        Column("s", number=True),
        Column("reward", number=True, wide=True),
        Column("advantage", number=True),
        Column("source", wide=True),
        Column("trained"),
    ]
    rows = [
        [
            "-" if c.index is None else str(c.index),
            c.agent_name or "-",
            c.span.span_id,
            str(len(c.prompt_ids)),
            str(len(c.tokens)),
            f"{c.latency_s:.2f}" if isinstance(c.latency_s, int | float) else "-",
            _num(c.transition.reward) if c.transition else "-",
            _num(c.transition.advantage) if c.transition and not v.held_out else "-",
            c.token_source,
            "held-out: never trained"
            if v.held_out
            else "yes"
            if c.transition
            else f"excluded: {c.exclusion}"
            if c.exclusion
            else "-",
        ]
        for c in v.calls
    ]
    title = (
        f"calls: tokens in and out, seconds, and transitions (LightningRL {v.settings['credit']} credit, "
        f"{v.settings['advantage']} advantage, group of {v.group_size})"
    )
    show(table(title, columns, rows, wide=wide, keep=("call", "prompt", "response", "trained")), wide=wide, to=console)
    if v.lightningrl_error:
        console.print(f"[red]LightningRL: {escape(v.lightningrl_error)}[/red]")
