"""Runner processes: start several :class:`~agentbolt.runners.runner.Runner` processes on one store,
watch them and replace one that dies.

Each process (``spawn``) imports the agent afresh, opens the store by URL and runs one
:class:`~agentbolt.runners.runner.Runner` until SIGTERM, when it drains as a runner does (see
:mod:`agentbolt.runners.runner`). On Linux a runner process gets SIGTERM when its parent dies, even by
SIGKILL, so no runner outlives the process that started it. :meth:`RunnerPool.watch` replaces
processes that died (a crash, SIGKILL, the OOM killer) while restarts remain; their rollouts
return to the queue when their leases expire. :mod:`agentbolt.runners.ray` is the same for Ray
actors.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import multiprocessing
import os
import signal
import socket
import time
from collections.abc import Callable, Coroutine
from typing import Any

from ..errors import UserError
from ..store import open_store
from .runner import AgentLike, Runner, RunnerConfig, load_agent

__all__ = ["RunnerPool"]

log = logging.getLogger(__name__)


def _exit_reason(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _die_with_parent(parent_pid: int) -> None:
    """Linux: get SIGTERM when the parent dies (even by SIGKILL), so no runner outlives it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the parent's shutdown stops the runners
        return
    if os.getppid() != parent_pid:  # the parent died before the call above
        os.kill(os.getpid(), signal.SIGTERM)


def _process_main(
    agent: Any, store_url: str, worker_id: str, config: RunnerConfig, log_level: int, ready: Any, parent_pid: int = 0
) -> None:
    _die_with_parent(parent_pid or os.getppid())
    logging.basicConfig(level=log_level, format=f"%(asctime)s %(levelname)s [{worker_id}] %(name)s: %(message)s")
    if log_level > logging.DEBUG:  # one INFO line per HTTP request of the agent's client drowns everything else
        for name in ("httpx", "httpx2", "httpcore"):
            logging.getLogger(name).setLevel(max(log_level, logging.WARNING))
    try:
        import uvloop

        runner_loop: Callable[[Coroutine[Any, Any, None]], None] = uvloop.run
    except ImportError:  # pragma: no cover
        runner_loop = asyncio.run
    runner_loop(_process_async(agent, store_url, worker_id, config, ready))


async def _process_async(agent: Any, store_url: str, worker_id: str, config: RunnerConfig, ready: Any) -> None:

    store = open_store(store_url)
    runner = Runner(agent, store, worker_id=worker_id, config=config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    signals_seen = 0

    def on_signal() -> None:
        nonlocal signals_seen
        signals_seen += 1
        if signals_seen == 1:
            log.info("stopping: finishing running rollouts (signal again to quit at once)")
            stop.set()
        else:
            os._exit(1)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    try:
        stats = await runner.run(stop, on_ready=ready.set)
        log.info("runner %s done: %s", worker_id, stats)
    finally:
        await store.close()


class RunnerPool:
    """Runner processes working on a store given by URL.

    Args:
        agent: the agent; a ``"module:attr"`` string, or an object picklable by reference
            (a module-level function or class), since each process imports it afresh.
        store_url: a URL every process can open (SQLite file, PostgreSQL, ``http://``).
        processes: how many processes.
        config: each process's :class:`RunnerConfig`.
        max_restarts: how many dead processes :meth:`watch` replaces over the pool's life.
    """

    def __init__(
        self,
        agent: AgentLike | str,
        store_url: str,
        *,
        processes: int = 1,
        config: RunnerConfig | None = None,
        name: str = "runner",
        max_restarts: int = 10,
    ) -> None:
        if store_url.startswith("memory:"):
            raise UserError(
                "runner processes cannot share a memory:// store; use sqlite:///path.db, or run the runner "
                "in this process (Trainer(runners=RunnerOptions(n=0)))"
            )
        if processes < 1:
            raise UserError(f"processes must be at least 1, got {processes}")
        if max_restarts < 0:
            raise UserError(f"max_restarts must be 0 or more, got {max_restarts}")
        if not isinstance(agent, str):
            load_agent(agent)  # validate early, in the parent
        self.agent = agent
        self.store_url = store_url
        self.config = config or RunnerConfig()
        self.processes: list[multiprocessing.process.BaseProcess] = []
        self._ready: list[Any] = []
        self._n = processes
        self._name = name
        self.max_restarts = max_restarts
        self.restarts = 0
        """Dead processes replaced so far."""
        self._spawned = 0
        self._stopping = False

    def _spawn(self) -> tuple[multiprocessing.process.BaseProcess, Any]:
        ctx = multiprocessing.get_context("spawn")
        level = logging.getLogger("agentbolt").getEffectiveLevel()
        worker_id = f"{self._name}-{socket.gethostname()}-{os.getpid()}-{self._spawned}"
        self._spawned += 1
        ready = ctx.Event()
        proc = ctx.Process(
            target=_process_main,
            args=(self.agent, self.store_url, worker_id, self.config, level, ready, os.getpid()),
            name=worker_id,
            daemon=True,
        )
        proc.start()
        return proc, ready

    def start(self) -> None:
        """Start the processes (``spawn``: each imports the agent afresh)."""
        self._stopping = False
        for _ in range(self._n):
            proc, ready = self._spawn()
            self.processes.append(proc)
            self._ready.append(ready)

    def watch(self) -> list[str]:
        """Replace processes that died (a crash, SIGKILL, the OOM killer), while restarts remain.

        Returns a line per replaced process. Their rollouts come back to the queue when their
        leases expire. Call it periodically (:class:`~agentbolt.Trainer` does, twice a second).

        Raises:
            RuntimeError: every process is dead and no restart is left; the message says why.
        """
        if self._stopping:
            return []
        replaced = []
        for i, proc in enumerate(self.processes):
            if proc.is_alive() or proc.exitcode == 0:
                continue
            if self.restarts >= self.max_restarts:
                continue
            self.restarts += 1
            line = (
                f"runner process {proc.name} died ({_exit_reason(proc.exitcode)}); starting a replacement "
                f"({self.restarts}/{self.max_restarts} restarts used); its rollouts return to the queue "
                f"when their {self.config.lease_s:g} s leases expire"
            )
            log.warning("%s", line)
            replaced.append(line)
            self.processes[i], self._ready[i] = self._spawn()
        if self.processes and not any(p.is_alive() for p in self.processes):
            codes = ", ".join(f"{p.name}: {_exit_reason(p.exitcode)}" for p in self.processes)
            raise RuntimeError(
                f"no runner process is left ({codes}) and the {self.max_restarts} restarts are used up; "
                "nothing can run the queued rollouts. The runners' log lines above say why they died "
                "(an agent that crashes its process, memory, a store they cannot open)."
            )
        return replaced

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Block until every process is claiming work (imports done, store open).

        Raises:
            RuntimeError: a process died or was not ready in time.
        """
        deadline = time.monotonic() + timeout
        for proc, ready in zip(self.processes, self._ready, strict=True):
            while not ready.wait(0.1):
                if not proc.is_alive():
                    raise RuntimeError(f"runner process {proc.name} exited with code {proc.exitcode} before it started")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"runner process {proc.name} was not ready after {timeout:.0f} s")

    def alive(self) -> list[bool]:
        return [p.is_alive() for p in self.processes]

    def stop(self, timeout: float | None = None) -> None:
        """SIGTERM every process (graceful drain), wait, then kill what is left."""
        self._stopping = True
        timeout = self.config.drain_timeout_s + 15 if timeout is None else timeout
        for p in self.processes:
            if p.is_alive() and p.pid is not None:
                os.kill(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for p in self.processes:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                log.warning("runner process %s did not stop in %.0f s; killing it", p.name, timeout)
                p.kill()
                p.join(5)
        self.processes.clear()
        self._ready.clear()

    def __enter__(self) -> RunnerPool:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
