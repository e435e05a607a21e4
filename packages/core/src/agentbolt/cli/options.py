"""Options several commands share, spelt once: where a server listens, which store a command
uses and how a secret is read from the environment."""

from __future__ import annotations

from typing import Annotated, Any

import typer

__all__ = ["ListenHost", "ListenPort", "secret_option", "store_option"]

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
