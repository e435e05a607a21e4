"""Marking store writes that nobody is waiting for, so a store may take them off the event loop.

The SQLite store runs an operation on the calling thread when the file lock is free (a thread
hand-off costs more than most operations). For a write no caller waits on, such as the
gateway's background span batches, that is the wrong trade: the event loop serving every call is
blocked for the whole insert and commit. Inside :func:`background_writes` (a context variable:
it covers the current task only, and tasks it starts), the SQLite store queues the operation on
its writer thread instead; while SQLite works there with the GIL released, the loop serves calls.
Other stores ignore it.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

__all__ = ["background_writes", "in_background"]

_BACKGROUND: contextvars.ContextVar[bool] = contextvars.ContextVar("agentbolt_store_background", default=False)


@contextlib.contextmanager
def background_writes() -> Iterator[None]:
    """Store operations awaited inside this block are not waited on by any caller's answer."""
    token = _BACKGROUND.set(True)
    try:
        yield
    finally:
        _BACKGROUND.reset(token)


def in_background() -> bool:
    """True inside :func:`background_writes`."""
    return _BACKGROUND.get()
