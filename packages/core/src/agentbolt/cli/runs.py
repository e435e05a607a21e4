"""Commands to inspect runs and rollouts, export them, and serve the dashboard.

agentbolt runs list [-q] [--wide]|show RUN          --store URL
agentbolt rollouts list --run RUN [--status ...] [--mode train|val] [-q] [--wide]   --store URL
agentbolt rollouts show ROLLOUT                    --store URL
agentbolt export --run RUN --format jsonl|otlp|sft-jsonl [--mode train|val|all] --store URL [--output FILE]
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
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, TypeVar
from urllib.parse import urlsplit

import orjson
import typer
from rich.tree import Tree

from .. import types as t
from ..errors import AgentboltError, UserError
from ..plugins.registry import default_plugins
from ..store.run_records import RolloutSearch
from .options import ListenHost, ListenPort, secret_option
from .tables import Column, show, table
from .tables import console as make_console

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
    str | None, secret_option("AGENTBOLT_STORE_TOKEN", "Bearer token of a store server.", "--store-token")
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


WideOption = Annotated[bool, typer.Option("--wide", "-w", help="Every column (the default fits 80 columns).")]
QuietOption = Annotated[bool, typer.Option("--quiet", "-q", help="Print only the ids, one per line.")]


@runs_app.command("list")
def runs_list(
    store: StoreOption,
    limit: Annotated[int, typer.Option(help="Most runs shown (newest first).")] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON lines.")] = False,
    wide: WideOption = False,
    quiet: QuietOption = False,
    store_token: TokenOption = None,
) -> None:
    """List runs, newest first, with their latest reward, held-out reward and loss
    (``RUN=$(agentbolt runs list -q --limit 1)``: the newest run's id)."""
    runs = _run(store, store_token, lambda s: s.list_runs(limit=limit))
    if quiet:
        for run in runs:
            typer.echo(run.run_id)
        return
    if as_json:
        for run in runs:
            typer.echo(run.model_dump_json())
        return
    columns = [
        Column("run", ident=True),
        Column("name"),
        Column("algorithm", wide=True),
        Column("model", wide=True),
        Column("status"),
        Column("started", wide=True),
        Column("steps", number=True),
        Column("reward", number=True),
        Column("held-out", number=True),
        Column("loss", number=True, wide=True),
    ]
    rows = [
        [
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
        ]
        for r in runs
    ]
    show(table(f"runs in {store}", columns, rows, wide=wide, keep=("status", "steps", "reward", "held-out")), wide=wide)


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
    console = make_console()
    console.print(f"[bold]{run.name or run.run_id}[/bold]  {run.run_id}  [{run.status.value}]")
    console.print(f"algorithm {run.algorithm}  model {run.model or '-'}  steps {run.steps}  rollouts {n_rollouts}")
    console.print(f"started {_time(run.started_at)}  ended {_time(run.ended_at) or '-'}")
    if run.error:
        console.print(f"[red]error: {run.error}[/red]")
    console.print_json(orjson.dumps(run.config).decode())
    rows = [[str(m.step), "  ".join(f"{k}={v:.4g}" for k, v in m.values.items())] for m in metrics]
    show(table("metrics per step", [Column("step", number=True), Column("metrics")], rows), to=console)
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
    mode: Annotated[
        t.RolloutMode | None, typer.Option(help="Only training (train) or held-out (val) rollouts.")
    ] = None,
    limit: Annotated[int, typer.Option(help="Most rollouts shown (newest first).")] = 50,
    wide: WideOption = False,
    quiet: QuietOption = False,
    store_token: TokenOption = None,
) -> None:
    """List rollouts, newest first."""

    query = RolloutSearch(run_id=run, status=status or None, step=step, mode=mode, limit=limit)
    page = _run(store, store_token, lambda s: s.search_rollouts(query))
    if quiet:
        for r in page.items:
            typer.echo(r.rollout_id)
        return
    columns = [
        Column("rollout", ident=True),
        Column("task", wide=True),
        Column("step", number=True, wide=True),
        Column("mode"),
        Column("status"),
        Column("reward", number=True),
        Column("attempts", number=True, wide=True),
        Column("failure"),
    ]
    rows = [
        [
            r.rollout_id,
            r.task_id or "",
            "" if r.step is None else str(r.step),
            r.mode.value,
            r.status.value,
            _num(r.final_reward),
            str(r.attempt_count),
            f"{r.error.kind.value}: {r.error.type}" if r.error else "",
        ]
        for r in page.items
    ]
    title = f"{page.total} rollouts" + (f" of {run}" if run else "")
    show(table(title, columns, rows, wide=wide, keep=("mode", "status", "reward")), wide=wide)


@rollouts_app.command("show")
def rollouts_show(
    rollout_id: Annotated[str, typer.Argument(help="The rollout id.")],
    store: StoreOption,
    wide: WideOption = False,
    store_token: TokenOption = None,
) -> None:
    """One rollout: its span tree and the transitions LightningRL makes from it."""
    from ..runs.views import trajectory

    v = _run(store, store_token, lambda s: trajectory(s, rollout_id))
    r = v.rollout
    console = make_console()
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
    columns = [
        Column("call", number=True),
        Column("agent"),
        Column("span", ident=True, wide=True),
        Column("prompt", number=True),
        Column("response", number=True),
        Column("reward", number=True),
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
        f"transitions (LightningRL {v.settings['credit']} credit, {v.settings['advantage']} advantage, "
        f"group of {v.group_size})"
    )
    show(table(title, columns, rows, wide=wide, keep=("call", "prompt", "response", "trained")), wide=wide, to=console)
    if v.lightningrl_error:
        console.print(f"[red]LightningRL: {v.lightningrl_error}[/red]")


# -- export ----------------------------------------------------------------------------------------


class ExportMode(StrEnum):
    train = "train"
    val = "val"
    all = "all"


@dataclass
class ExportCounts:
    """What :func:`_export` wrote, per rollout mode."""

    rollouts: Counter[str] = field(default_factory=Counter)
    """Rollouts exported, by mode (``train`` / ``val``)."""
    records: Counter[str] = field(default_factory=Counter)
    """Records written (transitions or spans), by the mode of their rollout."""
    left_out: Counter[str] = field(default_factory=Counter)
    """Finished rollouts of the run that ``--mode`` left out, by mode."""

    @property
    def total(self) -> int:
        return sum(self.records.values())


_MODE_NAMES = {"train": "training", "val": "held-out (val)"}


async def _export(
    store: Any,
    run_id: str,
    fmt: ExportFormat,
    write: Callable[[bytes], object],
    min_reward: float | None = None,
    mode: ExportMode = ExportMode.train,
) -> ExportCounts:
    """Write the transitions (jsonl, sft-jsonl) or spans (OTLP JSON, one request per line) of the
    run's finished rollouts of ``mode`` (training rollouts by default: held-out ones are never
    trained on and must not leak into training data)."""
    from ..runs.views import lightningrl_for
    from ..store.server.otlp_json import spans_to_otlp_json

    run = await store.get_run(run_id)
    counts = ExportCounts()
    rollouts: list[t.Rollout] = []
    offset = 0
    while True:
        page = await store.search_rollouts(RolloutSearch(run_id=run_id, limit=1000, offset=offset))
        for r in page.items:
            if not r.status.is_final:
                continue
            if mode is ExportMode.all or r.mode.value == mode.value:
                rollouts.append(r)
                counts.rollouts[r.mode.value] += 1
            else:
                counts.left_out[r.mode.value] += 1
        offset += len(page.items)
        if not page.items or offset >= page.total:
            break
    rollouts.reverse()  # enqueue order
    mode_of = {r.rollout_id: r.mode.value for r in rollouts}
    groups: dict[str, list[t.Rollout]] = {}
    for r in rollouts:
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
        if fmt is ExportFormat.otlp:
            flat = [s for r in batch for s in spans[r.rollout_id]]
            if flat:
                write(orjson.dumps(spans_to_otlp_json(flat)) + b"\n")
                for s in flat:
                    counts.records[mode_of[s.rollout_id or ""]] += 1
        elif fmt is ExportFormat.sft_jsonl:
            from ..runs.export import sft_records

            for record in sft_records(lrl.process(batch, spans).transitions, spans, min_reward=min_reward):
                write(orjson.dumps(record) + b"\n")
                counts.records[mode_of[record["rollout_id"]]] += 1
        else:
            for x in lrl.process(batch, spans).transitions:
                write(x.model_dump_json().encode() + b"\n")
                counts.records[mode_of[x.rollout_id]] += 1
        batch = []
    return counts


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
    mode: Annotated[
        ExportMode,
        typer.Option(
            "--mode",
            help="Which rollouts: train (default: held-out rollouts never leak into training data), val (the "
            "held-out ones) or all.",
        ),
    ] = ExportMode.train,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="File to write (default: stdout).")] = None,
    store_token: TokenOption = None,
    min_reward: Annotated[
        float | None,
        typer.Option("--min-reward", help="sft-jsonl: only transitions whose reward is at least this."),
    ] = None,
) -> None:
    """Export a run's transitions (made by LightningRL with the run's settings) or its spans, of
    its training rollouts unless --mode says otherwise."""
    out = output.open("wb") if output is not None else sys.stdout.buffer
    try:
        counts = _run(store, store_token, lambda s: _export(s, run, fmt, out.write, min_reward, mode))
    finally:
        if output is not None:
            out.close()
        else:
            out.flush()
    what = "spans" if fmt is ExportFormat.otlp else "transitions"
    parts = [
        f"{counts.records[m]} from {counts.rollouts[m]} {_MODE_NAMES[m]} rollouts"
        for m in ("train", "val")
        if counts.rollouts[m] or (mode.value == m)
    ]
    left = [f"{n} {_MODE_NAMES[m]} rollouts left out" for m, n in sorted(counts.left_out.items()) if n]
    typer.echo(
        f"exported {counts.total} {what} of {run}"
        + (f" to {output}" if output else "")
        + f": {'; '.join(parts)}"
        + (f" ({', '.join(left)}; --mode all includes them)" if left else ""),
        err=True,
    )


# -- dashboard -------------------------------------------------------------------------------------


def dashboard(
    store: StoreOption,
    host: ListenHost = "127.0.0.1",
    port: ListenPort = 4780,
    token: Annotated[
        str | None,
        secret_option(
            "AGENTBOLT_DASHBOARD_TOKEN", "Token the browser must present (open the printed URL with ?token=... once)."
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
