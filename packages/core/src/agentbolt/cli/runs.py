"""Commands to inspect runs and rollouts, export them, and serve the dashboard.

agentbolt runs list|show RUN                       --store URL
agentbolt rollouts list --run RUN [--status ...]   --store URL
agentbolt rollouts show ROLLOUT                    --store URL
agentbolt export --run RUN --format jsonl|otlp     --store URL [--output FILE]
agentbolt dashboard --store URL [--host 127.0.0.1 --port 4780] [--token T]

Each command imports what it runs inside its body (see :mod:`agentbolt.cli.app`). Every command
only reads the store. A store that cannot be opened (no such SQLite file, an
unreachable server or database, an older table layout) is a clear error with exit status 2.
"""

from __future__ import annotations

import asyncio
import socket
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, TypeVar
from urllib.parse import urlsplit

import orjson
import typer
from rich.console import Console
from rich.table import Table
from rich.tree import Tree

from .. import types as t
from ..errors import AgentboltError, UserError
from ..plugins.registry import default_plugins
from ..store.run_records import RolloutSearch

__all__ = ["open_existing_store", "register"]

R = TypeVar("R")

StoreOption = Annotated[
    str,
    typer.Option(
        "--store",
        "-s",
        envvar="AGENTBOLT_STORE",
        show_envvar=True,
        help="Store to read: sqlite:///runs.db, postgresql://host/db or http://host:4747.",
    ),
]
TokenOption = Annotated[
    str | None,
    typer.Option(
        "--store-token", envvar="AGENTBOLT_STORE_TOKEN", show_envvar=True, help="Bearer token of a store server."
    ),
]

runs_app = typer.Typer(help="Training and evaluation runs recorded in a store.", no_args_is_help=True)
rollouts_app = typer.Typer(help="Rollouts of a store.", no_args_is_help=True)


class ExportFormat(StrEnum):
    jsonl = "jsonl"
    otlp = "otlp"
    sft_jsonl = "sft-jsonl"


def open_existing_store(url: str, *, token: str | None = None) -> Any:
    """Open ``url`` for reading; ``UserError`` when there is no store there (a SQLite path that
    does not exist is not created)."""
    from ..store import open_store

    parts = urlsplit(url)
    options: dict[str, Any] = {}
    if parts.scheme.startswith("sqlite"):
        database = parts.path[1:] if parts.path.startswith("/") else parts.path
        if database and not Path(database).exists():
            raise UserError(f"no store at {url}: {database} does not exist (check the path; sqlite:////abs/path.db)")
        options["sweep_interval_s"] = 0
    elif parts.scheme in ("http", "https"):
        if token:
            options["token"] = token
        options["retries"] = 0
    elif parts.scheme.startswith("postgres"):
        options["sweep_interval_s"] = 0
    return open_store(url, **options)


@asynccontextmanager
async def _opened(url: str, token: str | None) -> AsyncIterator[Any]:
    store = open_existing_store(url, token=token)
    try:
        await store.list_runs(limit=1)  # proves the store answers (a server, a database) before any output
        yield store
    finally:
        await store.close()


def _run(url: str, token: str | None, work: Callable[[Any], Awaitable[R]]) -> R:
    async def go() -> R:
        async with _opened(url, token) as store:
            return await work(store)

    try:
        return asyncio.run(go())
    except (AgentboltError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from None


def _time(ts: float | None) -> str:

    return "" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def _num(x: Any) -> str:
    return "-" if x is None else (f"{x:.4g}" if isinstance(x, float) else str(x))


# -- runs ------------------------------------------------------------------------------------------


@runs_app.command("list")
def runs_list(
    store: StoreOption,
    limit: Annotated[int, typer.Option(help="Most runs shown (newest first).")] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON lines.")] = False,
    store_token: TokenOption = None,
) -> None:
    """List runs, newest first, with their latest reward and loss."""
    runs = _run(store, store_token, lambda s: s.list_runs(limit=limit))
    if as_json:
        for run in runs:
            typer.echo(run.model_dump_json())
        return
    table = Table(title=f"runs in {store}")
    for col in ("run", "name", "algorithm", "model", "status", "started", "steps", "reward", "held-out", "loss"):
        table.add_column(col, justify="right" if col in ("steps", "reward", "held-out", "loss") else "left")
    for r in runs:
        table.add_row(
            r.run_id,
            r.name or "",
            r.algorithm,
            r.model or "",
            r.status.value,
            _time(r.started_at),
            str(r.steps),
            _num(r.latest.get("train/reward")),
            _num(r.latest.get("val/reward")),
            _num(r.latest.get("update/loss")),
        )
    Console().print(table)


@runs_app.command("show")
def runs_show(
    run_id: Annotated[str, typer.Argument(help="The run id.")],
    store: StoreOption,
    store_token: TokenOption = None,
) -> None:
    """One run: its settings, latest metrics and metrics per step."""

    async def work(s: Any) -> tuple[Any, Any, Any, Any]:

        run = await s.get_run(run_id)
        return (
            run,
            await s.get_run_metrics(run_id),
            (await s.search_rollouts(RolloutSearch(run_id=run_id, limit=1))).total,
            await _algorithm_summary(run, s),
        )

    run, metrics, n_rollouts, summary = _run(store, store_token, work)
    console = Console()
    console.print(f"[bold]{run.name or run.run_id}[/bold]  {run.run_id}  [{run.status.value}]")
    console.print(f"algorithm {run.algorithm}  model {run.model or '-'}  steps {run.steps}  rollouts {n_rollouts}")
    console.print(f"started {_time(run.started_at)}  ended {_time(run.ended_at) or '-'}")
    if run.error:
        console.print(f"[red]error: {run.error}[/red]")
    console.print_json(orjson.dumps(run.config).decode())
    table = Table(title="metrics per step")
    table.add_column("step", justify="right")
    table.add_column("metrics")
    for m in metrics:
        table.add_row(str(m.step), "  ".join(f"{k}={v:.4g}" for k, v in m.values.items()))
    console.print(table)
    if summary is not None:
        console.print(summary)


async def _algorithm_summary(run: Any, store: Any) -> Any:
    """What the run's algorithm says about its runs (e.g. APO's table of prompt versions): the
    ``describe_run(run, store)`` of its registered factory, when it has one and is installed."""

    try:
        factory = default_plugins().algorithms.get(run.algorithm)
    except UserError:  # the algorithm's package is not installed where the run is read
        return None
    describe = getattr(factory, "describe_run", None)
    return None if describe is None else await describe(run, store)


# -- rollouts --------------------------------------------------------------------------------------


@rollouts_app.command("list")
def rollouts_list(
    store: StoreOption,
    run: Annotated[str | None, typer.Option("--run", help="Only rollouts of this run.")] = None,
    status: Annotated[list[t.RolloutStatus] | None, typer.Option("--status", help="Any of these statuses.")] = None,
    step: Annotated[int | None, typer.Option(help="Only this step.")] = None,
    limit: Annotated[int, typer.Option(help="Most rollouts shown (newest first).")] = 50,
    store_token: TokenOption = None,
) -> None:
    """List rollouts, newest first."""

    query = RolloutSearch(run_id=run, status=status or None, step=step, limit=limit)
    page = _run(store, store_token, lambda s: s.search_rollouts(query))
    table = Table(title=f"{page.total} rollouts" + (f" of {run}" if run else ""))
    for col in ("rollout", "task", "step", "mode", "status", "reward", "attempts", "failure"):
        table.add_column(col)
    for r in page.items:
        table.add_row(
            r.rollout_id,
            r.task_id or "",
            "" if r.step is None else str(r.step),
            r.mode.value,
            r.status.value,
            _num(r.final_reward),
            str(r.attempt_count),
            f"{r.error.kind.value}: {r.error.type}" if r.error else "",
        )
    Console().print(table)


@rollouts_app.command("show")
def rollouts_show(
    rollout_id: Annotated[str, typer.Argument(help="The rollout id.")],
    store: StoreOption,
    store_token: TokenOption = None,
) -> None:
    """One rollout: its span tree and the transitions LightningRL makes from it."""
    from ..runs.views import trajectory

    v = _run(store, store_token, lambda s: trajectory(s, rollout_id))
    r = v.rollout
    console = Console()
    console.print(
        f"[bold]{r.rollout_id}[/bold] [{r.status.value}] task {r.task_id} run {r.run_id or '-'} step "
        f"{'-' if r.step is None else r.step} reward {_num(v.final_reward)}"
    )
    if r.error:
        console.print(f"[red]{r.error.kind.value}: {r.error.type}: {r.error.message}[/red]")
    tree = Tree("spans (latest attempt)")
    stack: list[tuple[int, Any]] = [(-1, tree)]
    for row in v.rows:
        while stack[-1][0] >= row.depth:
            stack.pop()
        dur = "open" if row.duration_ms is None else f"{row.duration_ms:.1f} ms"
        node = stack[-1][1].add(f"[cyan]{row.kind}[/cyan] {row.span.name} [dim]{row.summary} · {dur}[/dim]")
        stack.append((row.depth, node))
    console.print(tree)
    table = Table(
        title=f"transitions (LightningRL {v.settings['credit']} credit, {v.settings['advantage']} advantage, "
        f"group of {v.group_size})"
    )
    for col in ("call", "agent", "span", "prompt", "response", "reward", "advantage", "source", "trained"):
        table.add_column(col)
    for c in v.calls:
        x = c.transition
        table.add_row(
            "-" if c.index is None else str(c.index),
            c.agent_name or "-",
            c.span.span_id,
            str(len(c.prompt_ids)),
            str(len(c.tokens)),
            _num(x.reward) if x else "-",
            _num(x.advantage) if x else "-",
            c.token_source,
            "yes" if x else f"excluded: {c.exclusion}" if c.exclusion else "-",
        )
    console.print(table)
    if v.lightningrl_error:
        console.print(f"[red]LightningRL: {v.lightningrl_error}[/red]")


# -- export ----------------------------------------------------------------------------------------


async def _export(
    store: Any, run_id: str, fmt: ExportFormat, write: Callable[[bytes], object], min_reward: float | None = None
) -> int:
    """Write the run's transitions (jsonl) or spans (OTLP JSON, one request per line); returns
    how many records were written."""
    from ..runs.views import lightningrl_for
    from ..store.server.otlp_json import spans_to_otlp_json

    run = await store.get_run(run_id)
    rollouts: list[t.Rollout] = []
    offset = 0
    while True:
        page = await store.search_rollouts(RolloutSearch(run_id=run_id, limit=1000, offset=offset))
        rollouts.extend(r for r in page.items if r.status.is_final)
        offset += len(page.items)
        if not page.items or offset >= page.total:
            break
    rollouts.reverse()  # enqueue order
    groups: dict[str, list[t.Rollout]] = {}
    for r in rollouts:
        groups.setdefault(r.group_id or r.rollout_id, []).append(r)
    lrl = lightningrl_for(run)
    written = 0
    batch: list[t.Rollout] = []
    for members in [*groups.values(), []]:
        batch.extend(members)
        if len(batch) < 200 and members:
            continue
        if not batch:
            break
        spans = await store.query_spans([r.rollout_id for r in batch], latest_attempt_only=True)
        if fmt is ExportFormat.otlp:
            flat = [s for r in batch for s in spans[r.rollout_id]]
            if flat:
                write(orjson.dumps(spans_to_otlp_json(flat)) + b"\n")
                written += len(flat)
        elif fmt is ExportFormat.sft_jsonl:
            from ..runs.export import sft_records

            for record in sft_records(lrl.process(batch, spans).transitions, spans, min_reward=min_reward):
                write(orjson.dumps(record) + b"\n")
                written += 1
        else:
            for x in lrl.process(batch, spans).transitions:
                write(x.model_dump_json().encode() + b"\n")
                written += 1
        batch = []
    return written


def export(
    run: Annotated[str, typer.Option("--run", help="The run to export.")],
    store: StoreOption,
    fmt: Annotated[
        ExportFormat,
        typer.Option(
            "--format",
            help="jsonl: one transition per line (token ids, logprobs, reward, advantage), for SFT or another "
            "trainer; otlp: the spans as OTLP/JSON, one ExportTraceServiceRequest per line; sft-jsonl: one "
            "transition per line in TRL's conversational format (messages) with input_ids/labels/masks.",
        ),
    ] = ExportFormat.jsonl,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="File to write (default: stdout).")] = None,
    store_token: TokenOption = None,
    min_reward: Annotated[
        float | None,
        typer.Option("--min-reward", help="sft-jsonl: only transitions whose reward is at least this."),
    ] = None,
) -> None:
    """Export a run's transitions (made by LightningRL with the run's settings) or its spans."""
    out = output.open("wb") if output is not None else sys.stdout.buffer
    try:
        n = _run(store, store_token, lambda s: _export(s, run, fmt, out.write, min_reward))
    finally:
        if output is not None:
            out.close()
        else:
            out.flush()
    what = "spans" if fmt is ExportFormat.otlp else "transitions"
    typer.echo(f"exported {n} {what} of {run}" + (f" to {output}" if output else ""), err=True)


# -- dashboard -------------------------------------------------------------------------------------


def dashboard(
    store: StoreOption,
    host: Annotated[str, typer.Option(help="Address to listen on; anything but loopback requires --token.")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(help="Port to listen on (0 picks a free one).")] = 4780,
    token: Annotated[
        str | None,
        typer.Option(
            envvar="AGENTBOLT_DASHBOARD_TOKEN",
            show_envvar=True,
            help="Token the browser must present (open the printed URL with ?token=... once).",
        ),
    ] = None,
    store_token: TokenOption = None,
) -> None:
    """Serve the read-only web dashboard of a store: runs (live, compared), rollouts, trajectory
    replay, reward debugger, health."""
    try:  # a separate distribution, so that core does not ship a web app to every agent
        from agentbolt_dashboard import create_app
    except ModuleNotFoundError as exc:
        if exc.name != "agentbolt_dashboard":
            raise
        typer.echo("error: the dashboard is not installed: pip install agentbolt-dashboard", err=True)
        raise typer.Exit(code=2) from None
    import uvicorn

    from ..store.server.run import is_loopback

    if not is_loopback(host) and not token:
        typer.echo(f"error: listening on {host} exposes the store's data; pass --token (or bind 127.0.0.1)", err=True)
        raise typer.Exit(code=2)
    try:
        opened = open_existing_store(store, token=store_token)
        asyncio.run(opened.list_runs(limit=1))
    except (AgentboltError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from None
    app = create_app(opened, token=token)

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        typer.echo(f"error: cannot listen on {host}:{port}: {exc.strerror or exc}", err=True)
        raise typer.Exit(code=2) from None
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    hint = "  (open it once with ?token=<token>)" if token else ""
    typer.echo(f"agentbolt dashboard of {opened.url} at http://{shown}:{bound}/{hint}  (Ctrl-C to stop)", err=True)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")

    async def serve() -> None:
        try:
            await uvicorn.Server(config).serve(sockets=[sock])
        finally:
            await opened.close()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass


def register(app: typer.Typer) -> None:
    """Add these commands to the ``agentbolt`` command line."""
    app.add_typer(runs_app, name="runs")
    app.add_typer(rollouts_app, name="rollouts")
    app.command("export")(export)
    app.command("dashboard")(dashboard)
