"""Garbage-collector settings for a long-running serving process (``agentbolt gateway serve``,
``agentbolt serve``).

CPython's full collection walks every tracked object, and a serving process holds hundreds of
thousands from its imports (pydantic, SQLAlchemy, the CLI) that never become garbage. Under load
the gateway promotes the objects of its buffered spans to the oldest generation quickly, so full
collections come every second or two, each a pause of tens of ms on the event loop that every
call arriving meanwhile waits out. :func:`freeze_startup_objects` moves what exists once the
process is set up into the permanent generation (``gc.freeze``): collections then walk only what
was made since. Nothing is lost: frozen objects are simply never collected, as they would not
have been anyway; cycles made later are collected as before.

Only the process's own entry point calls it (a library must not change the collector of the
process it is imported into).
"""

from __future__ import annotations

import gc

__all__ = ["freeze_startup_objects"]


def freeze_startup_objects() -> int:
    """Collect once, then freeze every object that survived; returns how many are frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
