"""Stress test of the K = 2 stall: agents that drop their OpenAI clients unclosed (not in CI).

Run:  uv run python benchmarks/agent_fd_reuse.py [--loop agent|plain] [--rollouts 3000]
      [--concurrency 96] [--stall-s 60] [--gc-threshold 700]

What runs is what ``benchmarks/async.py`` runs, with a fake model: ``Trainer.dev`` (the
in-process runner: the runner's event loop, the agent loop, the gateway on its own thread) in
front of ``agentbolt.testing``'s fake OpenAI server answering in 0.1-3 s (log-uniform), half of its
answers a calculator call. The agent is ``benchmarks/async.py``'s tail agent, the quickstart
agent behind log-normal tool delays (median 0.5 s, sigma 1.0): a new ``openai.AsyncOpenAI`` per
rollout, ``max_retries=0``, never closed, up to three calls. Rounds of ``--rollouts`` rollouts,
``--concurrency`` at a time, run until ``--minutes`` have passed; the garbage collector runs as
it does by default (``--gc-threshold`` sets its first threshold: lower collects more often).

A **stall** is an attempt still running after ``--stall-s``: the runner times it out (the real
symptom was a call unanswered until openai's 600 s timeout, then a retried attempt). Printed per
round and in total: rollouts, stalls (with their age), and the unclosed socket transports the
collector finalized, by thread (a finalization on a thread other than the agent loop's is what
schedules openai's ``aclose()`` on a foreign event loop; see ``agentbolt.runners.agent_loop``).
``--loop plain`` runs the agents on asyncio's own event loop, as before that module existed.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib
import math
import random
import sys
import threading
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples" / "quickstart"))
sys.path.insert(0, str(REPO / "benchmarks"))


def fake_model(seed: int) -> Any:
    """The fake OpenAI server's backend: 0.1-3 s per answer, half of them a calculator call
    (never after a tool answer, so that a rollout makes one to three calls)."""
    from agentbolt.testing.fake_llm import FakeLLM, ToolCall, ToolCalls

    rng = random.Random(seed)
    lock = threading.Lock()

    def draw() -> float:
        with lock:
            return rng.random()

    def reply(request: Any) -> Any:
        messages = request.body.get("messages") or []
        if messages and messages[-1].get("role") != "tool" and draw() < 0.5:
            return ToolCalls([ToolCall("calc", {"expression": "2 + 3"})])
        return "<answer>5</answer>"

    return FakeLLM(default_reply=reply, latency_s=lambda request: 0.1 * math.exp(draw() * math.log(30.0)))


class Finalized:
    """Counts the 'unclosed transport' warnings (a socket transport finalized without being
    closed) by the thread that ran the collector."""

    def __init__(self) -> None:
        self.by_thread: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._previous = warnings.showwarning

    def install(self) -> None:
        warnings.simplefilter("always", ResourceWarning)

        def show(message: Any, category: type[Warning], *args: Any, **kwargs: Any) -> None:
            if category is ResourceWarning and "unclosed transport" in str(message):
                with self._lock:
                    self.by_thread[threading.current_thread().name] += 1
                return
            if category is not ResourceWarning:
                self._previous(message, category, *args, **kwargs)

        warnings.showwarning = show


def describe(task: asyncio.Task[Any]) -> str:
    """Where a stuck agent waits: its innermost frames, and its connection's socket (descriptor,
    local port, registered with the loop for reading or not, readable now or not)."""
    import select

    frames = []
    coro: Any = task.get_coro()
    while (frame := getattr(coro, "cr_frame", None) or getattr(coro, "ag_frame", None)) is not None:
        frames.append(frame)
        coro = getattr(coro, "cr_await", None) or getattr(coro, "ag_await", None)
    where = " -> ".join(f"{f.f_code.co_name}:{f.f_lineno}" for f in frames[-4:])
    stream = next(
        (f.f_locals.get("self") for f in frames if type(f.f_locals.get("self")).__name__ == "SocketStream"), None
    )
    if stream is None:
        return where
    transport = stream._transport
    sock = transport.get_extra_info("socket")
    fd = sock.fileno()
    loop = transport._loop
    key = loop._selector.get_map().get(fd) if loop is not None else None
    readable = bool(select.select([fd], [], [], 0)[0]) if fd >= 0 else None
    return (
        f"{where}; fd {fd} local port {sock.getsockname()[1] if fd >= 0 else '-'}, reading={transport.is_reading()}, "
        f"registered={key is not None and bool(key.events & 1)} (handle {key.data[0] if key else None}), readable now={readable}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--loop", choices=["agent", "plain"], default="agent")
    parser.add_argument("--rollouts", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=96)
    parser.add_argument("--stall-s", type=float, default=60.0)
    parser.add_argument("--gc-threshold", type=int, default=700, help="gc's first threshold (Python's default: 700)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from math_tasks import make_tasks

    import agentbolt.runners.workers as workers
    from agentbolt.testing.fake_llm import FakeLLMServer
    from agentbolt.trainer import Trainer

    make_agent = importlib.import_module("async").make_agent  # benchmarks/async.py's tail agent
    if args.loop == "plain":
        workers.new_agent_loop = asyncio.new_event_loop  # type: ignore[attr-defined]  # before the fix
    gc.set_threshold(args.gc_threshold, *gc.get_threshold()[1:])
    finalized = Finalized()
    finalized.install()

    tail = make_agent(0.5, 1.0, args.seed)
    stalls: list[float] = []
    errors: Counter[str] = Counter()
    running: dict[asyncio.Task[Any], float] = {}

    async def agent(task: dict[str, Any], resources: Any) -> float:
        started = time.monotonic()
        me = asyncio.current_task()
        assert me is not None
        running[me] = started
        try:
            return await tail(task, resources)
        except asyncio.CancelledError:  # the runner timed the attempt out
            stalls.append(time.monotonic() - started)
            raise
        except Exception as exc:  # e.g. openai's APITimeoutError: which httpx timeout, after how long
            errors[f"{type(exc).__name__} <- {type(exc.__cause__).__name__}"] += 1
            raise
        finally:
            running.pop(me, None)

    def watchdog() -> None:
        reported: set[int] = set()
        while True:
            time.sleep(2.0)
            for task, since in list(running.items()):
                if time.monotonic() - since > args.stall_s * 0.75 and id(task) not in reported:
                    reported.add(id(task))
                    print(f"-- an attempt running for {time.monotonic() - since:.0f} s: {describe(task)}", flush=True)

    threading.Thread(target=watchdog, name="watchdog", daemon=True).start()

    print(
        f"loop={args.loop} rollouts={args.rollouts} concurrency={args.concurrency} stall_s={args.stall_s:g} "
        f"gc_threshold={gc.get_threshold()} python={sys.version.split()[0]}",
        flush=True,
    )
    started = time.monotonic()
    with FakeLLMServer(fake_model(args.seed)) as server:
        trainer = Trainer(
            agent,
            store="memory://",
            runners={"n": 0, "concurrency": args.concurrency, "timeout_s": args.stall_s, "max_attempts": 3},
            capture={"adapters": []},
            progress=False,
        )
        result = trainer.dev(
            make_tasks(args.rollouts, args.seed, "t", heldout=False), llm=server.base_url, model="fake-model"
        )
    print(
        f"total: loop={args.loop} {args.rollouts} rollouts in {(time.monotonic() - started) / 60:.1f} min: "
        f"failed {result.failed} {dict(result.failures)}, attempts timed out {len(stalls)} "
        f"{sorted(round(s) for s in stalls)}, attempts failed {dict(errors)}; unclosed transports finalized, by thread: {dict(finalized.by_thread)}",
        flush=True,
    )


if __name__ == "__main__":
    main()
