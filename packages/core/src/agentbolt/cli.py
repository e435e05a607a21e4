"""The ``agentbolt`` command line.

agentbolt --version
agentbolt plugins [--json]
agentbolt store serve --store sqlite:///runs.db --host 127.0.0.1 --port 4747
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from . import __version__

app = typer.Typer(
    name="agentbolt",
    help="Train any AI agent with reinforcement learning.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
store_app = typer.Typer(help="Run or inspect a store.", no_args_is_help=True)
app.add_typer(store_app, name="store")


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
) -> None:
    """List each plugin, its distribution and version, and what it registered."""
    from .plugins import default_plugins

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
    table = Table(title="agentbolt plugins")
    for column in ("plugin", "distribution", "version", "registered", "status"):
        table.add_column(column)
    for i in infos:
        registered = "\n".join(f"{kind}: {', '.join(names)}" for kind, names in sorted(i.registered.items()))
        status = "ok" if i.ok else "[red]failed (see below)[/red]"
        table.add_row(i.name, i.distribution or "-", i.version or "-", registered or "-", status)
    console = Console()
    console.print(table)
    failed = [i.error for i in infos if i.error is not None]
    for error in failed:  # in full, below the table, so nothing is cut by the terminal width
        console.print(f"[red]error:[/red] {error}", soft_wrap=True)
    if failed:
        raise typer.Exit(code=1)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
