"""Agents for benchmarks/reliability.py (importable by runner processes)."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import threading
import time
from pathlib import Path

import openai

from agentbolt import types as t


async def work(task: object, resources: t.Resources) -> float:
    """A short piece of work (R1).

    A task ``{"hold": path}`` is where the benchmark kills a runner process: its first attempt
    writes this process's id to ``path`` and waits there (until the benchmark kills the process
    with SIGKILL); the attempt that runs after the kill finds ``path`` and finishes.
    """
    if isinstance(task, dict) and "hold" in task and _first_visit(Path(task["hold"])):
        await asyncio.sleep(120)
    await asyncio.sleep(random.uniform(0.02, 0.2))
    return 1.0


def _first_visit(marker: Path) -> bool:
    """Write this process's id to ``marker`` unless it exists; whether it did not."""
    if marker.exists():
        return False
    partial = marker.with_suffix(".partial")
    partial.write_text(str(os.getpid()))
    partial.rename(marker)  # the benchmark never reads half a pid
    return True


async def calls_llm(task: object, resources: t.Resources) -> float:
    """One chat call through the gateway (R5, R6)."""
    assert resources.llm is not None
    client = openai.AsyncOpenAI(base_url=resources.llm.base_url, api_key="k", max_retries=0, timeout=30)
    try:
        await client.chat.completions.create(model=str(task or "m"), messages=[{"role": "user", "content": "hi"}])
    finally:
        await client.close()
    return 1.0


async def raises(task: object, resources: t.Resources) -> float:
    raise ValueError("the agent's own bug")


def hangs_sync(task: object, resources: t.Resources) -> float:
    threading.Event().wait()
    return 1.0


async def blocks_loop(task: object, resources: t.Resources) -> float:
    time.sleep(3.0)  # noqa: ASYNC251 - blocking the loop is the point
    return 1.0


def returns(task: object, resources: t.Resources) -> object:
    """Returns ``task`` as its reward (a string, NaN, None, 1e308, True, 10**400)."""
    return {"nan": float("nan"), "huge_int": 10**400}.get(str(task), task)


async def no_llm(task: object, resources: t.Resources) -> float:
    return 0.5


def dies_once(task: object, resources: t.Resources) -> float:
    marker = Path(str(task))
    if not marker.exists():
        marker.write_text("killed once")
        os.kill(os.getpid(), signal.SIGKILL)
    return 1.0


async def streams_llm(task: object, resources: t.Resources) -> float:
    """One streamed chat call through the gateway (R5)."""
    assert resources.llm is not None
    client = openai.AsyncOpenAI(base_url=resources.llm.base_url, api_key="k", max_retries=0, timeout=30)
    try:
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        async for _ in stream:
            pass
    finally:
        await client.close()
    return 1.0
