"""Agents that misbehave, importable by runner processes."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

from agentbolt import types as t


def never_returns(task: object, resources: t.Resources) -> float:
    """A synchronous agent that never returns (and cannot be interrupted)."""
    threading.Event().wait()
    return 1.0


async def blocks_its_loop(task: object, resources: t.Resources) -> float:
    """An async agent that blocks its event loop (``time.sleep``) for ``task`` seconds."""
    time.sleep(float(task))  # type: ignore[arg-type]
    return 1.0


async def quick(task: object, resources: t.Resources) -> float:
    return 1.0


def kills_its_process(task: object, resources: t.Resources) -> float:
    """Kills the runner process it runs in, every time."""
    os.kill(os.getpid(), signal.SIGKILL)
    return 1.0


def kills_its_process_once(task: object, resources: t.Resources) -> float:
    """Kills its runner process the first time (``task`` is a marker file path), then succeeds."""
    marker = Path(str(task))
    if not marker.exists():
        marker.write_text("killed once")
        os.kill(os.getpid(), signal.SIGKILL)
    return 1.0
