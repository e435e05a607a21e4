"""The ``agentbolt`` command line (Typer): :mod:`~agentbolt.cli.app` holds the app and the
store, gateway, runner and doctor commands; :mod:`~agentbolt.cli.runs` the commands that read
runs (``runs``, ``rollouts``, ``dashboard``); :mod:`~agentbolt.cli.export` ``export``;
:mod:`~agentbolt.cli.tables` the tables
both print (readable at 80 columns, ``--wide`` for every column)."""

from __future__ import annotations

from .app import app, main

__all__ = ["app", "main"]
