"""Commands to inspect runs and rollouts, and serve the dashboard (export: :mod:`agentbolt.cli.export`).

agentbolt runs list [-q] [--wide]|show RUN          --store URL
agentbolt rollouts list --run RUN [--status ...] [--mode train|val] [-q] [--wide]   --store URL
agentbolt rollouts show ROLLOUT                    --store URL
agentbolt dashboard --store URL [--host 127.0.0.1 --port 4780] [--token T]

Each command imports what it runs inside its body (see :mod:`agentbolt.cli.app`). Every command
only reads the store. A store that cannot be opened (no such SQLite file, an
unreachable server or database, an older table layout) is a clear error with exit status 2.
"""

from __future__ import annotations

import asyncio
import socket
import textwrap
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any, TypeVar
from urllib.parse import urlsplit

import orjson
import typer

from ..errors import AgentboltError, NotFoundError, UserError
from ..plugins.registry import default_plugins
from .options import (
    ListenHost,
    ListenPort,
    QuietOption,
    ReadStoreOption,
    StoreTokenOption,
    WideOption,
    secret_option,
)
from .tables import Column, show, table
from .tables import console as make_console

__all__ = ["not_found", "open_existing_store", "register", "run_in_store"]

R = TypeVar("R")

StoreOption = ReadStoreOption
TokenOption = StoreTokenOption

runs_app = typer.Typer(
    help="Training and evaluation runs recorded in a store.", no_args_is_help=True, rich_markup_mode="markdown"
)


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


def run_in_store(url: str, token: str | None, work: Callable[[Any], Awaitable[R]], *, run: str | None = None) -> R:
    """``work(store)`` on the opened store. An unknown id (``run``, checked first when given, or
    any the work asks for) is an error with exit status 1; a store that cannot be read, 2."""

    async def go() -> R:
        async with _opened(url, token) as store:
            if run is not None:
                await store.get_run(run)
            return await work(store)

    try:
        return asyncio.run(go())
    except NotFoundError as exc:
        typer.echo(f"error: {not_found(exc, url)}", err=True)
        raise typer.Exit(code=1) from None
    except (AgentboltError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from None


def not_found(exc: NotFoundError, url: str) -> str:
    """``no run 'x' in sqlite:///runs.db (agentbolt runs list -s ... lists them)``."""
    ids = exc.ids if isinstance(exc.ids, list | tuple) else [exc.ids]
    shown = ", ".join(repr(str(i)) for i in ids)
    lister = "runs list" if exc.what == "run" else "rollouts list"
    return f"no {exc.what} {shown} in {url} (agentbolt {lister} -s {url} lists them)"


def _time(ts: float | None) -> str:

    return "" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def _num(x: Any) -> str:
    return "-" if x is None else (f"{x:.4g}" if isinstance(x, float) else str(x))


# -- runs ------------------------------------------------------------------------------------------


@runs_app.command("list")
def runs_list(
    store: StoreOption,
    limit: Annotated[int, typer.Option(help="Most runs shown (newest first).")] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON lines (each run with its summary).")] = False,
    wide: WideOption = False,
    quiet: QuietOption = False,
    store_token: TokenOption = None,
) -> None:
    """List runs, newest first: each run's held-out metric at its first and last evaluation, its
    training reward (mean of the last steps), seconds per step (mean) and training-health findings.
    RUN=$(agentbolt runs list -q --limit 1) is the newest run's id."""
    from ..runs.summary import LAST_K, run_summary

    async def work(s: Any) -> list[Any]:
        runs = await s.list_runs(limit=limit)
        if quiet:
            return [(r, None) for r in runs]
        return [(r, await run_summary(s, r.run_id)) for r in runs]

    listed = run_in_store(store, store_token, work)
    if quiet:
        for run, _ in listed:
            typer.echo(run.run_id)
        return
    if as_json:
        for run, card in listed:
            typer.echo(orjson.dumps({**run.model_dump(mode="json"), "summary": card.to_dict()}).decode())
        return
    metrics = {card.headline.metric for _, card in listed if card.headline is not None}
    columns = [
        Column("run", ident=True),
        Column("name", wide=True),
        Column("algorithm", wide=True),
        Column("model", wide=True),
        Column("status", ident=True),
        Column("started", wide=True),
        Column("steps", number=True),
        Column("held-out", ident=True),
        Column("reward", number=True),
        Column("s/step", number=True),
        Column("findings"),
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
            _heldout_cell(card, named=len(metrics) > 1),
            _num3(card.train_reward),
            "-" if card.s_per_step is None else f"{card.s_per_step:.1f}",
            _findings_cell(card),
        ]
        for r, card in listed
    ]
    console = make_console()
    show(
        table(f"runs in {store}", columns, rows, wide=wide, keep=("status", "steps", "held-out", "reward")),
        wide=wide,
        to=console,
    )
    named = next(iter(metrics)) if len(metrics) == 1 else "each run's own metric"
    console.print(
        f"held-out: {named}, first -> last evaluation (runs show RUN: ± se and n); reward: training reward, "
        f"mean of the last {LAST_K} steps; s/step: mean; findings: agentbolt doctor -s STORE --run RUN",
        style="dim",
        highlight=False,
    )


def _num3(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _heldout_cell(card: Any, *, named: bool) -> str:
    """``0.292→0.531`` (``accuracy 0.292→0.531`` when ``named``; one value with one evaluation,
    ``-`` with none)."""
    h = card.headline
    if h is None:
        return "-"
    value = f"{h.first.mean:.3f}" if len(h.evaluations) == 1 else f"{h.first.mean:.3f}→{h.last.mean:.3f}"
    return f"{h.metric} {value}" if named else value


def _findings_cell(card: Any) -> str:
    if card.findings is None:
        return "-"
    if not card.findings:
        return "none"
    warned = card.warnings
    return f"{warned} warning{'s' if warned != 1 else ''}" if warned else f"{len(card.findings)} info"


PER_STEP = ("train/reward", "val/{metric}", "val/reward", "update/loss", "update/kl", "time/step_s")
"""The columns of ``runs show``'s metrics per step (``--all``: every metric)."""


@runs_app.command("show")
def runs_show(
    run_id: Annotated[str, typer.Argument(help="The run id (agentbolt runs list).")],
    store: StoreOption,
    all_metrics: Annotated[
        bool, typer.Option("--all", help="Also every recorded metric of every step, and the run's settings (JSON).")
    ] = False,
    store_token: TokenOption = None,
) -> None:
    """One run: did it learn (the summary card: held-out before -> after with standard errors,
    trivial policies, training reward, s/step, findings), then its main metrics per step."""
    from ..runs.summary import run_summary

    async def work(s: Any) -> tuple[Any, Any, Any]:
        return (
            await run_summary(s, run_id),
            await s.get_run_metrics(run_id),
            await _algorithm_summary(await s.get_run(run_id), s),
        )

    card, metrics, summary = run_in_store(store, store_token, work, run=run_id)
    run = card.run
    console = make_console()
    named = (
        f"[bold]{run.name}[/bold]  {run.run_id}"
        if run.name and run.name != run.run_id
        else f"[bold]{run.run_id}[/bold]"
    )
    console.print(f"{named}  \\[{run.status.value}]", highlight=False)

    def say(text: str, indent: int = 0) -> None:  # wrapped to the terminal, continuation lines indented
        console.print(
            textwrap.fill(
                text, max(40, console.width), initial_indent=" " * indent, subsequent_indent=" " * (indent + 4)
            ),
            highlight=False,
            markup=False,
        )

    say(
        f"{run.algorithm} on {run.model or '-'}; {run.steps} steps, {card.rollouts} rollouts; started "
        f"{_time(run.started_at)}, ended {_time(run.ended_at) or '-'}"
    )
    if run.error:
        console.print(f"[red]error: {run.error}[/red]")
    for line in card.lines():
        say(line, 2)
    for f in card.findings or ():
        say(f"{f.severity.upper()} {f.code}: {f.message}. Fix: {f.fix}", 2)
    per_step: dict[int, dict[str, float]] = {}
    for m in metrics:
        per_step.setdefault(m.step, {}).update(m.values)
    if all_metrics:
        console.print_json(orjson.dumps(run.config).decode())
        rows = [
            [str(k), "  ".join(f"{n}={v:.4g}" for n, v in sorted(vs.items()))] for k, vs in sorted(per_step.items())
        ]
        show(table("every metric per step", [Column("step", number=True), Column("metrics")], rows), to=console)
    else:
        metric = card.headline.metric if card.headline is not None and card.headline.metric != "reward" else "accuracy"
        keys = [k.format(metric=metric) for k in PER_STEP]
        keys = [k for k in keys if any(k in vs for vs in per_step.values())]
        labels = {"train/reward": "training reward", "val/reward": "held-out reward", "time/step_s": "s/step"}
        labels[f"val/{metric}"] = f"held-out {metric}"
        columns = [Column("step", number=True), *(Column(labels.get(k, k.split("/")[-1]), number=True) for k in keys)]
        rows = [[str(k), *(_num(vs.get(name)) for name in keys)] for k, vs in sorted(per_step.items())]
        show(table("main metrics per step (--all: every metric and the settings)", columns, rows), to=console)
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
    # rollouts (agentbolt.cli.rollouts) and export (agentbolt.cli.export) are added by agentbolt.cli.app
    app.command("dashboard")(dashboard)
