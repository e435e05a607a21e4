"""The ``agentbolt`` command line.

agentbolt --version
agentbolt plugins [--json]
agentbolt store serve --store sqlite:///runs.db --host 127.0.0.1 --port 4747
agentbolt runs|rollouts|dashboard ...   (see agentbolt.cli.runs)
agentbolt export --run RUN --format jsonl|otlp|sft-jsonl|chat-jsonl|atif   (see agentbolt.cli.export)
agentbolt doctor -s sqlite:///runs.db [--run RUN_ID]   (or AGENTBOLT_STORE)
agentbolt serve --upstream URL | --policy module:name   (see agentbolt.cli.serve)
agentbolt ingest --run NAME [--tokenizer NAME] [--group-by ATTR]   (see agentbolt.cli.ingest)

Each command imports the part it runs inside its body (the store server and the gateway bring
FastAPI and uvicorn, the runners Ray or SQLAlchemy), so ``agentbolt --help`` and every command
load only what they use.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import sys
import textwrap
import time
from typing import TYPE_CHECKING, Annotated, Any

import typer

from .. import __version__
from .. import types as t
from ..capture.roles import AgentRoles
from ..errors import AgentboltError, StoreUnavailableError, UserError
from ..plugins.registry import default_plugins
from ..policies import Policies
from ..store.urls import check_store_url
from .export import register as _register_export
from .ingest import register as _register_ingest
from .options import ListenHost, ListenPort, ReadStoreOption, secret_option, store_option
from .rollouts import rollouts_app
from .runs import not_found, open_existing_store
from .runs import register as _register_run_commands
from .serve import register as _register_serve
from .tables import Column, show, table
from .tables import console as make_console

if TYPE_CHECKING:
    from ..runs.doctor import DoctorReport

app = typer.Typer(
    name="agentbolt",
    help="Train any AI agent with reinforcement learning.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",  # docstrings' line breaks join into paragraphs; no markup shows raw
)
store_app = typer.Typer(help="Run or inspect a store.", no_args_is_help=True, rich_markup_mode="markdown")
app.add_typer(store_app, name="store")
gateway_app = typer.Typer(help="Run the OpenAI-compatible gateway.", no_args_is_help=True, rich_markup_mode="markdown")
app.add_typer(gateway_app, name="gateway")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"agentbolt {__version__}")
        raise typer.Exit()


@app.callback()
def main_callback(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log debug messages.")] = False,
) -> None:
    """agentbolt: train any AI agent with reinforcement learning."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


@app.command()
def plugins(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    wide: Annotated[bool, typer.Option("--wide", "-w", help="Every column (the default fits 80 columns).")] = False,
) -> None:
    """List each plugin, its distribution and version, and what it registered."""

    infos = default_plugins().infos()
    if as_json:
        typer.echo(
            json.dumps(
                [
                    {
                        "name": i.name,
                        "distribution": i.distribution,
                        "version": i.version,
                        "registered": i.registered,
                        "error": None if i.error is None else str(i.error),
                    }
                    for i in infos
                ],
                indent=2,
            )
        )
        return
    columns = [
        Column("plugin", ident=True),
        Column("distribution", ident=True),
        Column("version", wide=True),
        Column("registered"),
        Column("status"),
    ]
    rows = [
        [
            i.name,
            i.distribution or "-",
            i.version or "-",
            "\n".join(f"{kind}: {', '.join(names)}" for kind, names in sorted(i.registered.items())) or "-",
            "ok" if i.ok else "[red]failed (see below)[/red]",
        ]
        for i in infos
    ]
    console = make_console()
    show(table("agentbolt plugins", columns, rows, wide=wide, keep=("registered", "status")), wide=wide, to=console)
    failed = [i.error for i in infos if i.error is not None]
    for error in failed:  # in full, below the table, so nothing is cut by the terminal width
        console.print(f"[red]error:[/red] {error}", soft_wrap=True)
    if failed:
        raise typer.Exit(code=1)


@store_app.command("serve")
def store_serve(
    store: Annotated[
        str, store_option("Store to serve, e.g. sqlite:///runs.db or postgresql://host/db.")
    ] = "sqlite:///agentbolt.db",
    host: ListenHost = "127.0.0.1",
    port: ListenPort = 4747,
    token: Annotated[
        str | None,
        secret_option(
            "AGENTBOLT_STORE_TOKEN",
            "Bearer token every request must carry (prefer the environment variable to keep it out of ps).",
        ),
    ] = None,
    max_wait: Annotated[
        float, typer.Option("--max-wait", help="Longest one request waits in dequeue / wait (clients loop).")
    ] = 30.0,
    access_log: Annotated[bool, typer.Option("--access-log", help="Log every request.")] = False,
) -> None:
    """Serve a store over HTTP (OpenAPI at /openapi.json) with OTLP trace ingest at /v1/traces."""
    from ..store.server import serve

    try:
        serve(store, host=host, port=port, token=token, max_wait_s=max_wait, access_log=access_log)
    except (UserError, StoreUnavailableError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from None


@gateway_app.command("serve")
def gateway_serve(
    upstream: Annotated[
        list[str] | None,
        typer.Option(
            "--upstream",
            "-u",
            help="OpenAI-compatible base URL (with /v1) to forward to; repeat for several. Without it, "
            "calls get 503 until a trainer sets upstreams (POST /gateway/upstreams, GatewayClient).",
        ),
    ] = None,
    store: Annotated[str, store_option("Store for spans and attempt checks.")] = "sqlite:///agentbolt.db",
    host: ListenHost = "127.0.0.1",
    port: ListenPort = 4800,
    token: Annotated[
        str | None, secret_option("AGENTBOLT_GATEWAY_TOKEN", "Bearer token agents send as their api_key.")
    ] = None,
    upstream_key: Annotated[
        str | None, secret_option("AGENTBOLT_UPSTREAM_API_KEY", "API key sent to the upstreams.")
    ] = None,
    model: Annotated[str | None, typer.Option(help="Model name forced into every request.")] = None,
    request_timeout: Annotated[
        float, typer.Option(help="Seconds to wait for an upstream answer (and between streamed chunks).")
    ] = 600.0,
    allowed_host: Annotated[
        list[str] | None,
        typer.Option(help="Host name a tokenless gateway also answers (besides loopback); repeat for several."),
    ] = None,
    retokenize: Annotated[
        str | None,
        typer.Option(
            help="Hugging Face tokenizer (name or path) of the served model: calls whose upstream returns no token "
            "ids get ids rebuilt from text and checked for drift (token_source=retokenized)."
        ),
    ] = None,
    agent_name: Annotated[
        list[str] | None,
        typer.Option(
            help="NAME=TEXT: calls whose system prompt contains TEXT are recorded as agent NAME (repeatable; "
            "NAME=re:PATTERN searches a regex)."
        ),
    ] = None,
    policy: Annotated[
        list[str] | None,
        typer.Option(
            help="NAME=AGENT[,AGENT...]: calls of these agents go to policy NAME, asked of the upstream as model "
            "NAME (a vLLM LoRA module, an agentbolt-torch adapter); repeatable, first match wins, NAME=re:PATTERN "
            "searches a regex; other agents' calls go to the base model (--model)."
        ),
    ] = None,
    durable_calls: Annotated[
        bool,
        typer.Option(
            help="An answered call is durable before the answer's last byte is sent (a crash loses no "
            "call a client received in full); --no-durable-calls writes call records in background batches."
        ),
    ] = True,
    call_log: Annotated[
        str,
        typer.Option(
            help="Directory of the local call log that makes answered calls durable with one write (the store "
            "gets them in background batches; a restarted gateway adds what a crash left there). 'auto': "
            "DB_FILE-calls next to a SQLite store, none for other stores; 'none': each answer waits for the "
            "store's commit instead."
        ),
    ] = "auto",
) -> None:
    """Serve the gateway: agents call {gateway}/rollouts/{rollout}/attempts/{attempt}/v1
    (Chat Completions, Completions, the Responses API and the Anthropic Messages API)."""

    from ..gateway import Upstream
    from ..long_running_gc import freeze_startup_objects
    from ..options import CaptureOptions, GatewayOptions
    from ..store import open_store

    try:  # the same option objects as Trainer(gateway=..., capture=...)
        capture = CaptureOptions(
            agent_names=AgentRoles.from_specs(agent_name or []),
            token_ids="retokenize" if retokenize else "exact",
            tokenizer=retokenize,
        )
        options = GatewayOptions(
            upstreams=[Upstream(base_url=u, api_key=upstream_key) for u in upstream or []],
            host=host,
            port=port,
            token=token,
            upstream_timeout_s=request_timeout,
            durable_calls=durable_calls,
            call_log=_call_log_dir(call_log, store),
        )
        captured = capture.gateway_options()
        policies = Policies.from_specs(policy or [])
        if policies is not None:
            captured["policy_router"] = policies.router()
    except UserError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from None

    async def run() -> None:
        opened = open_store(store)
        gateway = options.gateway(opened, captured, served_model=model, allowed_hosts=allowed_host or ())
        await gateway.start(options.host, options.port)
        freeze_startup_objects()  # full collections then skip what the imports and start-up made
        target = ", ".join(upstream) if upstream else "no upstream yet: set them with POST /gateway/upstreams"
        typer.echo(f"gateway listening on {gateway.url} (forwarding to {target})", err=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await gateway.stop()
        await opened.close()

    try:
        import uvloop

        uvloop.run(run())
    except (UserError, StoreUnavailableError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from None


def _call_log_dir(option: str, store: str) -> str | None:
    """``agentbolt gateway serve --call-log``: 'auto' is next to a SQLite store's file."""
    if option == "none":
        return None
    if option != "auto":
        return option
    if not store.startswith("sqlite:"):
        return None
    from ..store.urls import sqlite_path

    return f"{sqlite_path(store)}-calls"


@app.command()
def runner(
    agent: Annotated[
        str,
        typer.Argument(
            help="The agent as 'package.module:function' (or :Class with a rollout method), or an environment "
            "package as 'KIND://NAME' (e.g. 'verifiers://add-env' with agentbolt-verifiers)."
        ),
    ],
    store: Annotated[str, store_option("Store URL: http://HOST:PORT for a store server.")],
    processes: Annotated[int, typer.Option("--processes", "-n", help="Runner processes.")] = 1,
    concurrency: Annotated[int, typer.Option("--concurrency", "-c", help="Rollouts each process runs at once.")] = 8,
    lease: Annotated[float, typer.Option(help="Lease seconds (renewed every third of it).")] = 30.0,
    mode: Annotated[str | None, typer.Option(help="Only claim 'train' or 'val' rollouts.")] = None,
    token: Annotated[str | None, secret_option("AGENTBOLT_STORE_TOKEN", "Bearer token of the store server.")] = None,
    ray: Annotated[
        str | None,
        typer.Option(
            "--ray",
            help="Run the runners as Ray actors on the cluster at ADDRESS (HOST:6379, 'auto', or 'local' for a "
            "new local cluster); --processes is then the number of actors. Needs agentbolt\\[ray].",
        ),
    ] = None,
    num_cpus: Annotated[float, typer.Option("--num-cpus", help="With --ray: CPUs reserved per actor.")] = 1.0,
    resource: Annotated[
        list[str] | None,
        typer.Option("--resource", help="With --ray: a custom Ray resource per actor, NAME=AMOUNT (repeatable)."),
    ] = None,
) -> None:
    """Attach runner processes to a store (e.g. a store server on another machine) and run the
    agent on the rollouts it hands out, until Ctrl-C / SIGTERM. With --ray, the runners are Ray
    actors placed on a Ray cluster (restarted by Ray if they die)."""

    from ..options import RunnerOptions
    from ..runners.ray import RayWorkerOptions, parse_resources

    if token:
        os.environ["AGENTBOLT_STORE_TOKEN"] = token  # runner processes inherit it
    pool: Any
    try:  # the same option object as Trainer(runners=...)
        check_store_url(store)
        options = RunnerOptions(
            n=processes,
            concurrency=concurrency,
            lease_s=lease,
            kind="processes" if ray is None else "ray",
            ray_address=None if ray in (None, "local") else ray,
            ray_options=None
            if ray is None
            else RayWorkerOptions(num_cpus=num_cpus, resources=parse_resources(resource or [])),
        )
        config = options.config(mode=t.RolloutMode(mode) if mode else None)
        pool = options.pool(agent, store, config, store_token=token if ray is not None else None)
    except (UserError, ValueError, RuntimeError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from None

    class _Stop(Exception):
        pass

    def stop_starting(*_: object) -> None:
        raise _Stop

    # A signal while the processes start must not leave any of them behind.
    signal.signal(signal.SIGTERM, stop_starting)
    signal.signal(signal.SIGINT, stop_starting)
    try:
        pool.start()
        pool.wait_ready()
    except _Stop:
        typer.echo("stopping: interrupted while the runner processes started", err=True)
        pool.stop(timeout=10)
        raise typer.Exit(code=130) from None
    except (UserError, ValueError, RuntimeError) as exc:
        pool.stop(timeout=10)
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from None
    where = f"Ray actor(s) on {ray}" if ray is not None else "runner process(es)"
    typer.echo(f"{processes} {where} x {concurrency} working on {store}; Ctrl-C to stop", err=True)
    stop = False

    def on_signal(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    failure = None
    last_check = time.monotonic()
    while not stop:
        if ray is None:
            try:
                pool.watch()  # replace a runner process that died
            except RuntimeError as exc:
                failure = exc
                break
            if not any(pool.alive()):
                break
        elif time.monotonic() - last_check > 10:  # Ray restarts dead actors; log it
            pool.status()
            last_check = time.monotonic()
        time.sleep(0.5)
    pool.stop()
    if failure is not None:
        typer.echo(f"error: {failure}", err=True)
        raise typer.Exit(code=1)


@app.command()
def doctor(
    store: ReadStoreOption,
    run: Annotated[
        str | None, typer.Option(help="Only this run: a rollout id prefix such as run-3f2a (Trainer run ids).")
    ] = None,
    rollout: Annotated[list[str] | None, typer.Option(help="Only these rollout ids (repeatable).")] = None,
    since_s: Annotated[float | None, typer.Option(help="Only rollouts created in the last N seconds.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Report what the store's rollouts captured (token sources, drift, failed vs missing calls,
    template rewrites, adapters, agent names, group sizes), each run's training health (reward
    without held-out gain, entropy collapse, identical samples, tool calls) and what to fix.
    Exit 1 if anything is wrong or an id is unknown, 2 if the store cannot be read."""

    from ..errors import NotFoundError
    from ..runs.doctor import doctor as run_doctor

    async def go() -> DoctorReport:
        opened = open_existing_store(store)  # a reader never creates a store
        try:
            since = time.time() - since_s if since_s is not None else None
            return await run_doctor(opened, run=run, rollout_ids=rollout or None, since=since)
        finally:
            await opened.close()

    try:
        report = asyncio.run(go())
    except NotFoundError as exc:
        typer.echo(f"error: {not_found(exc, store)}", err=True)
        raise typer.Exit(code=1) from None
    except (AgentboltError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from None
    if run is not None and report.counts.rollouts == 0:
        typer.echo(
            f"error: no rollouts of run {run!r} in {store} (agentbolt runs list -s {store} lists them)", err=True
        )
        raise typer.Exit(code=1)
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2))
    else:
        width = max(40, shutil.get_terminal_size().columns)
        for line in report.render().splitlines():  # wrapped to the terminal, continuation lines indented
            typer.echo(textwrap.fill(line, width, subsequent_indent="    ", break_on_hyphens=False) if line else "")
    raise typer.Exit(0 if report.ok else 1)


_register_run_commands(app)  # runs, dashboard
_register_export(app)  # export
app.add_typer(rollouts_app, name="rollouts")
_register_serve(app)  # serve
_register_ingest(app)  # ingest


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
