"""``Trainer.dev`` start-up: runner processes (each imports the frameworks) vs the in-process runner.

Run:  uv run python benchmarks/dev_startup.py [--tasks 4] [--repeat 3]

The agent is the OpenAI Agents SDK on its default model (the Responses API) against the fake
backend, so a runner pays the import of ``agents`` (and of every installed adapter's framework).
Each variant runs in a fresh Python process (nothing imported yet, as for a user): ``total`` is
from that process's start to ``dev()`` returning, ``dev()`` the call alone.

- ``processes``: ``Trainer(runners={"n": 1}).dev(...)`` with ``in_process=False`` (dev before this change);
- ``in-process``: ``Trainer(runners={"n": 1}).dev(...)`` (dev now runs its runner in the calling process).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agentbolt.options import RunnerOptions

START = time.perf_counter()


async def agent(task: dict[str, Any], resources: Any) -> float:
    from agents import Agent, Runner
    from agents.models.openai_provider import OpenAIProvider
    from agents.run import RunConfig

    config = RunConfig(
        model=resources.llm.model, model_provider=OpenAIProvider(base_url=resources.llm.base_url, api_key="x")
    )
    result = await Runner.run(Agent(name="solver", instructions="Answer briefly."), task["question"], run_config=config)
    return 1.0 if "42" in str(result.final_output) else 0.0


def child(variant: str, tasks: int) -> None:
    import logging

    logging.disable(logging.WARNING)
    from agents.tracing import set_trace_processors

    set_trace_processors([])  # no export to OpenAI from a benchmark
    from agentbolt.testing.fake_llm import FakeLLM, FakeLLMServer
    from agentbolt.trainer import Trainer

    with tempfile.TemporaryDirectory() as tmp, FakeLLMServer(FakeLLM(default_reply="The answer is 42.")) as server:
        trainer = Trainer(agent, store=f"sqlite:///{Path(tmp) / 'dev.db'}", runners=RunnerOptions(n=1), progress=False)
        started = time.perf_counter()
        result = trainer.dev(
            [{"question": f"What is 6 times 7? ({i})"} for i in range(tasks)],
            llm=server.base_url,
            model="fake-model",
            in_process=variant == "in-process",
        )
        done = time.perf_counter()
    assert result.succeeded == tasks, result.failures
    print(json.dumps({"total": done - START, "dev": done - started, "calls": result.llm_calls}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--child", choices=["processes", "in-process"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.tasks)
        return
    print(
        f"Trainer.dev start-up: {args.tasks} tasks, OpenAI Agents SDK agent, fake backend; median of {args.repeat} fresh processes"
    )
    print(f"{'runner':>11} | {'total':>8} {'dev()':>8} | calls")
    for variant in ("processes", "in-process"):
        rows = []
        for _ in range(args.repeat):
            out = subprocess.run(
                [sys.executable, __file__, "--child", variant, "--tasks", str(args.tasks)],
                capture_output=True,
                text=True,
                check=True,
            )
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        total = statistics.median(r["total"] for r in rows)
        dev = statistics.median(r["dev"] for r in rows)
        print(f"{variant:>11} | {total:>7.2f}s {dev:>7.2f}s | {rows[0]['calls']}")


if __name__ == "__main__":
    main()
