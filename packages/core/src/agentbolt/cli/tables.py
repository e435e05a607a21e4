"""Tables of the command line that stay readable in an 80-column terminal.

Each table names its columns once: identifiers are never cut (they are what one copies into the
next command), long text wraps, a column empty in every row is left out, and columns marked
``wide`` appear only with ``--wide``, which prints every column at its natural width (the
terminal wraps lines that are longer, and a note on stderr says so).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from rich import box
from rich.console import Console, Group, RenderableType
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

__all__ = ["Column", "console", "show", "table"]


@dataclass(frozen=True)
class Column:
    """One column of a CLI table."""

    name: str
    wide: bool = False
    """Shown only with ``--wide``."""
    number: bool = False
    """Right-aligned, never wrapped."""
    ident: bool = False
    """An identifier: shown whole (never truncated, never wrapped)."""


def console() -> Console:
    """The console tables print to (its width: the terminal's, or ``COLUMNS``)."""
    return Console()


def table(
    title: str | None,
    columns: Sequence[Column],
    rows: Sequence[Sequence[str]],
    *,
    wide: bool = False,
    keep: Sequence[str] = (),
) -> RenderableType:
    """A table of ``rows`` (one string per column of ``columns``) under its title (a line of its
    own, never wrapped to the table's width): ``--wide`` columns only when ``wide``, and columns
    empty (or ``-``) in every row left out unless named in ``keep``."""
    shown = [
        i
        for i, c in enumerate(columns)
        if (wide or not c.wide) and (c.name in keep or not rows or any(r[i] not in ("", "-") for r in rows))
    ]
    out = Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for i in shown:
        c = columns[i]
        justify: Literal["left", "right"] = "right" if c.number else "left"
        if c.ident:
            width = max([len(c.name), *(len(r[i]) for r in rows)])
            out.add_column(c.name, no_wrap=True, min_width=width, overflow="ignore")
        else:
            out.add_column(c.name, justify=justify, no_wrap=c.number, overflow="fold", min_width=len(c.name))
    for r in rows:
        out.add_row(*(r[i] for i in shown))
    return out if title is None else Group(Text(title, style="bold"), out)


def show(printed: RenderableType, *, wide: bool = False, to: Console | None = None) -> None:
    """Print a table: fitted to the terminal, or with ``wide`` at its natural width."""
    out = to or console()
    if wide:
        natural = Measurement.get(out, out.options.update_width(100_000), printed).maximum
        if natural > out.width:
            Console(stderr=True).print(
                f"--wide: this table is {natural} columns wide and the terminal {out.width}: its lines wrap "
                "(without --wide it fits)",
                style="dim",
                highlight=False,
            )
            out = Console(width=natural, file=out.file, force_terminal=out.is_terminal)
    out.print(printed)
