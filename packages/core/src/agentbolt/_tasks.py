"""asyncio helpers for agentbolt's background tasks."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

__all__ = ["cancel_and_wait"]


async def cancel_and_wait(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and wait until it has stopped. Its cancellation is not raised; an exception
    it ended with before it could be cancelled is."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
