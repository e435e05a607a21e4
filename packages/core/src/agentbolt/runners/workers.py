"""Where agents run: isolated from the runner's own event loop, so no agent can stall it.

A runner's event loop claims rollouts, renews leases (heartbeats), enforces deadlines and
reports results. An agent must not be able to stop any of that:

- a **synchronous** agent runs on a daemon thread of its own: one that never returns is
  abandoned when its attempt ends (threads cannot be killed), and a daemon thread does not keep
  the process from exiting;
- an **asynchronous** agent runs on an *agent loop*, an event loop on a daemon thread: one that
  blocks its loop (a CPU loop, ``time.sleep``) stalls only that loop, while the runner's loop
  keeps heartbeating and times the attempt out.

When an attempt ends under an agent (timeout, lost lease, cancellation), the agent is cancelled
and given ``grace_s`` to stop. An agent that ignores cancellation is abandoned, and when it was
async its agent loop is replaced by a fresh one for the next rollouts: the stuck loop keeps
nothing else hostage. Contextvars (the rollout's attribution) follow the agent to its thread.

The agent loop is an :class:`~agentbolt.runners.agent_loop.AgentEventLoop`: asyncio's loop, made
safe against the clients agents drop without closing them (a garbage-collected ``AsyncOpenAI``
could otherwise leave a later model call unanswered until its timeout; see that module).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
from collections.abc import Callable
from typing import Any

from .agent_loop import new_agent_loop

__all__ = ["AgentAbandoned", "AgentWorkers"]

log = logging.getLogger(__name__)


class AgentAbandoned(Exception):
    """The agent ignored cancellation for ``grace_s`` and was left running on its own."""


class _AgentLoop:
    """An event loop on a daemon thread."""

    def __init__(self, name: str) -> None:
        self.loop = new_agent_loop()
        self._lock = threading.Lock()
        self._starts: list[tuple[Callable[[], None], contextvars.Context]] = []
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)
        self.thread.start()

    def submit(self, start: Callable[[], None], context: contextvars.Context) -> None:
        """Run ``start()`` in ``context`` on this loop soon. Thread-safe.

        Agents that start together (a claim brings several rollouts) share one wake-up of the
        loop: each wake-up is a write to its self-pipe, a system call that releases the GIL, and
        getting the GIL back beside a busy agent thread can take a whole switch interval.
        """
        with self._lock:
            self._starts.append((start, context))
            if len(self._starts) > 1:  # a wake-up is already on its way
                return
        try:
            self.loop.call_soon_threadsafe(self._run_starts)
        except RuntimeError:  # the loop is closed: refuse this start, and let no later one wait behind it
            with self._lock:
                self._starts.clear()
            raise

    def _run_starts(self) -> None:
        with self._lock:
            starts, self._starts = self._starts, []
        for start, context in starts:
            try:
                context.run(start)
            except Exception:  # start() reports its own failures; this is a bug, never a lost agent
                log.exception("starting an agent on the agent loop failed")

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            try:
                pending = asyncio.all_tasks(self.loop)
                for task in pending:
                    task.cancel()
                if pending:
                    self.loop.run_until_complete(asyncio.wait(pending, timeout=1.0))
            finally:
                self.loop.close()

    def stop(self) -> None:
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.loop.stop)


class AgentWorkers:
    """Runs agent calls away from the caller's event loop (see the module docstring).

    Args:
        name: prefix of thread names.
        grace_s: how long a cancelled agent may take to stop before it is abandoned.
    """

    def __init__(self, name: str = "agentbolt-agent", *, grace_s: float = 2.0) -> None:
        self.name = name
        self.grace_s = grace_s
        self.abandoned = 0
        """Agents that ignored cancellation and were left running."""
        self.loops_replaced = 0
        """Agent loops replaced because an agent on them ignored cancellation."""
        self._loop: _AgentLoop | None = None
        self._old_loops: list[_AgentLoop] = []
        self._threads = 0

    def _agent_loop(self) -> _AgentLoop:
        if self._loop is None:
            self._loop = _AgentLoop(f"{self.name}-loop")
        return self._loop

    async def call_async(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``await fn(*args)`` on the agent loop, in a copy of the current context."""
        worker = self._agent_loop()
        here = asyncio.get_running_loop()
        result: asyncio.Future[Any] = here.create_future()
        finished = asyncio.Event()
        started: list[asyncio.Future[Any]] = []

        def transfer(task: asyncio.Future[Any]) -> None:  # on the caller's loop
            finished.set()
            if result.done():
                return
            if task.cancelled():
                result.cancel()
            elif (error := task.exception()) is not None:
                result.set_exception(error)
            else:
                result.set_result(task.result())

        def start() -> None:  # on the agent loop, in a copy of the caller's context
            try:
                task = asyncio.ensure_future(fn(*args))
            except BaseException as exc:  # fn(*args) itself raised
                failed = worker.loop.create_future()
                failed.set_exception(exc)
                task = failed
            started.append(task)
            task.add_done_callback(lambda t: _call_soon(here, transfer, t))

        worker.submit(start, contextvars.copy_context())
        try:
            return await result
        except asyncio.CancelledError:
            worker.loop.call_soon_threadsafe(lambda: started and started[0].cancel())
            if not await _wait(finished, self.grace_s):
                self.abandoned += 1
                if self._loop is worker:  # new rollouts get a fresh loop; the stuck one keeps only its own
                    self._old_loops.append(worker)
                    self._loop = None
                    self.loops_replaced += 1
                log.warning(
                    "an async agent ignored cancellation for %.1f s (blocking its event loop or swallowing "
                    "CancelledError); it was abandoned and its agent loop replaced",
                    self.grace_s,
                )
            raise

    async def call_sync(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on a daemon thread of its own, in a copy of the current context."""
        here = asyncio.get_running_loop()
        result: asyncio.Future[Any] = here.create_future()
        finished = threading.Event()
        ctx = contextvars.copy_context()

        def settle(value: Any, exc: BaseException | None) -> None:
            if result.done():
                return
            if exc is not None:
                result.set_exception(exc)
            else:
                result.set_result(value)

        def main() -> None:
            try:
                value = ctx.run(fn, *args)
            except BaseException as exc:
                _call_soon(here, settle, None, exc)
            else:
                _call_soon(here, settle, value, None)
            finally:
                finished.set()

        self._threads += 1
        threading.Thread(target=main, name=f"{self.name}-{self._threads}", daemon=True).start()
        try:
            return await result
        except asyncio.CancelledError:
            if not finished.is_set():
                self.abandoned += 1
                log.warning(
                    "a synchronous agent is still running after its attempt ended; its thread is abandoned "
                    "(threads cannot be stopped: make the agent return, e.g. with timeouts on its calls)"
                )
            raise

    def close(self) -> None:
        """Stop the agent loops (a loop blocked by an agent is left to die with the process)."""
        for worker in [*self._old_loops, *([self._loop] if self._loop else [])]:
            worker.stop()
        self._old_loops.clear()
        self._loop = None


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> None:
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the caller's loop is closed: nobody waits for this result any more
        pass


async def _wait(event: asyncio.Event, timeout: float) -> bool:
    try:
        await asyncio.wait_for(event.wait(), timeout)
        return True
    except TimeoutError:
        return False
