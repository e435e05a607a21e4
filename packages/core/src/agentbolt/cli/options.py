"""Options several commands share, spelt once: where a server listens, which store a command
uses and how a secret is read from the environment."""

from __future__ import annotations

from typing import Annotated, Any

import typer

__all__ = [
    "ListenHost",
    "ListenPort",
    "QuietOption",
    "ReadStoreOption",
    "StoreTokenOption",
    "WideOption",
    "secret_option",
    "store_option",
]

ListenHost = Annotated[str, typer.Option(help="Address to listen on; anything but loopback requires --token.")]
"""``--host`` of a server command (default it to ``"127.0.0.1"``)."""
ListenPort = Annotated[int, typer.Option(help="Port to listen on (0 picks a free one).")]
"""``--port`` of a server command (default it to the server's own port)."""


def secret_option(envvar: str, help: str, *names: str) -> Any:
    """A token or API key option, also read from ``envvar`` (shown in ``--help``; the environment
    keeps a secret out of ``ps``). ``names``: its flags, when not the parameter's own name."""
    return typer.Option(*names, envvar=envvar, show_envvar=True, help=help)


def store_option(help: str) -> Any:
    """``--store`` / ``-s``: the store URL a command uses (``help`` says what for)."""
    return typer.Option("--store", "-s", help=help)


ReadStoreOption = Annotated[
    str,
    typer.Option(
        "--store",
        "-s",
        envvar="AGENTBOLT_STORE",
        show_envvar=True,
        help="Store to read: sqlite:///runs.db, postgresql://host/db or http://host:4747.",
    ),
]
"""``--store`` / ``-s`` (or ``AGENTBOLT_STORE``) of every command that reads a store."""
StoreTokenOption = Annotated[
    str | None, secret_option("AGENTBOLT_STORE_TOKEN", "Bearer token of a store server.", "--store-token")
]
"""``--store-token`` (or ``AGENTBOLT_STORE_TOKEN``): the token of a store server."""
WideOption = Annotated[
    bool,
    typer.Option(
        "--wide", "-w", help="Every column, at its natural width: wider than 80 columns (the default fits 80)."
    ),
]
QuietOption = Annotated[bool, typer.Option("--quiet", "-q", help="Print only the ids, one per line.")]
