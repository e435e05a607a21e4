"""Train one agent of a smolagents team (instrumented with OpenInference) with GRPO, on CPU.

    uv run python examples/smolagents_agent/train.py                        # SmolLM2, train the solver
    uv run python examples/smolagents_agent/train.py --train-agents all     # every agent
    uv run python examples/smolagents_agent/train.py --model tiny --steps 2 # a smoke run

agentbolt has no smolagents adapter: the team's structure (which agent made each LLM call, the
calculator and final_answer tool calls, the steps) comes from the spans of OpenInference's
``SmolagentsInstrumentor``, which the agent sets up itself, read by ``agentbolt-openinference``.
The gateway records every call with exact token ids; LightningRL joins each to smolagents' LLM
span and trains the calls of the agents ``--train-agents`` selects (default: ``solver``; the
manager's calls are recorded and excluded as ``agent_not_selected``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # agent.py; also in the runner processes

from agent import agent, tasks  # noqa: E402

from agentbolt.lightningrl import LightningRL, LightningRLConfig  # noqa: E402
from agentbolt.options import RunnerOptions  # noqa: E402
from agentbolt.store import open_store  # noqa: E402
from agentbolt.trainer import Trainer  # noqa: E402
from agentbolt_torch.training.algorithm import TorchGRPO  # noqa: E402
from agentbolt_torch.training.asynchronous import add_async_argument, rollouts_in_flight  # noqa: E402

NAME = "smolagents_agent"
AGENT_SETS = {"solver": "^solver$", "manager": "^manager$", "all": None}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2", help="smollm2 (bundled), tiny (random, for smoke runs) or a HF dir")
    p.add_argument("--steps", type=int, default=6, help="training steps (default 6)")
    p.add_argument("--batch-size", type=int, default=4, help="questions per step (default 4)")
    p.add_argument("--group-size", type=int, default=4, help="samples per question (default 4)")
    p.add_argument("--val", type=int, default=16, help="held-out questions (default 16)")
    p.add_argument("--train-agents", default="solver", help="solver (default), manager, all, or a regex")
    p.add_argument("--max-tokens", type=int, default=48, help="tokens per reply (default 48)")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--runners", type=int, default=1, help="runner processes (default 1)")
    p.add_argument("--store", default=f"sqlite:///runs/{NAME}.db", help="store URL")
    p.add_argument("--out", default=f"runs/{NAME}", help="metrics, curve and checkpoint directory")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true", help="log lines instead of progress bars")
    add_async_argument(p)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    agent_match = AGENT_SETS.get(args.train_agents, args.train_agents)
    train = tasks(args.batch_size * max(args.steps, 1), held_out=False, seed=args.seed)
    val = tasks(args.val, held_out=True, seed=args.seed)
    if args.store.startswith("sqlite:///"):
        Path(args.store.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    algorithm = TorchGRPO(
        args.model,
        steps=args.steps,
        batch_size=args.batch_size,
        group_size=args.group_size,
        sampling={"temperature": args.temperature, "max_tokens": args.max_tokens},
        evaluation={"every": max(args.steps, 1)},
        output={"out_dir": args.out},
        update={"lr": args.lr, "seed": args.seed},
        lightningrl=LightningRLConfig(agent_match=agent_match),
        seed=args.seed,
    )
    trainer = Trainer(
        agent,
        algorithm,
        store=args.store,
        runners=RunnerOptions(
            n=args.runners,
            concurrency=rollouts_in_flight(args.batch_size, args.group_size, args.max_staleness),
            timeout_s=600.0,
        ),
        progress=not args.no_progress,
    )
    result = trainer.fit(train, val, max_staleness=args.max_staleness)
    structure = asyncio.run(what_lightningrl_saw(args.store, agent_match))
    summary = {**result.to_dict(), "example": NAME, "train_agents": args.train_agents, **structure}
    (Path(args.out) / "result.json").write_text(json.dumps(summary, indent=2))

    def fmt(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.3f}"

    print(
        f"held-out accuracy {fmt(result.accuracy_before)} -> {fmt(result.accuracy_after)} ({len(val)} questions, "
        f"{result.steps} steps, {result.seconds_per_step:.1f} s/step)",
        flush=True,
    )
    print(f"LightningRL saw, over the training rollouts: {structure['lightningrl']}", flush=True)
    return 0


async def what_lightningrl_saw(store_url: str, agent_match: Any) -> dict[str, Any]:
    """Per agent, the training calls LightningRL trained and excluded; the tools that ran; how
    the calls were joined to smolagents' spans; the share of exact token ids."""
    store = open_store(store_url)
    try:
        rollouts = [r for r in (await store.query_rollouts(limit=100_000)).items if r.mode.value == "train"]
        spans = await store.query_spans([r.rollout_id for r in rollouts], latest_attempt_only=True)
    finally:
        await store.close()
    batch = LightningRL(LightningRLConfig(agent_match=agent_match), allow_empty=True).process(rollouts, spans)
    report = batch.report
    tools = Counter(
        str(s.attributes.get("gen_ai.tool.name"))
        for ss in spans.values()
        for s in ss
        if s.attributes.get("agentbolt.span.kind") == "tool"
    )
    per_agent = {name: {"calls": a.calls, "trained": a.trained} for name, a in sorted(report.per_agent.items())}
    exact = sum(1 for tr in batch.transitions if tr.token_source.value == "exact")
    line = ", ".join(f"{name}: {a['trained']}/{a['calls']} calls trained" for name, a in per_agent.items())
    line += f"; tools run: {dict(tools)}; joins: {dict(sorted(report.extraction.items()))}"
    return {
        "per_agent": per_agent,
        "tools": dict(tools),
        "joins": report.extraction,
        "excluded": report.excluded,
        "exact_token_id_share": exact / len(batch.transitions) if batch.transitions else None,
        "lightningrl": line,
    }


if __name__ == "__main__":
    sys.exit(main())
