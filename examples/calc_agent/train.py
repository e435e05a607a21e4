"""Train an AutoGen calculator agent (Calc-X word problems) with GRPO, on CPU, through agentbolt.

    uv run python examples/calc_agent/train.py                     # the defaults below, SmolLM2 on CPU
    uv run python examples/calc_agent/train.py --steps 0 --val 48  # held-out accuracy of the base model only
    uv run python examples/calc_agent/train.py --data ~/Calc-X     # the real Calc-X files (data/train-*.parquet ...)

What runs: a SQLite store (``runs/calc_agent.db``), the gateway, a runner process executing the
AutoGen agent of ``agent.py`` (its calls are recorded with exact token ids, the adapter records
agent names and tool calls), and ``torch-grpo``, which turns the calls into transitions with
LightningRL and updates the weights. Held-out accuracy (the final ``<answer>`` matches the
Calc-X ``result``) is measured before and after, with how often the model calls the calculator.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # agent.py, calculator.py, data.py; also in the runner processes

from agent import calc_agent  # noqa: E402
from data import DataError, load  # noqa: E402
from figures import run_figures  # noqa: E402

from agentbolt.options import RunnerOptions  # noqa: E402
from agentbolt.trainer import Trainer  # noqa: E402
from agentbolt.types import Task  # noqa: E402
from agentbolt_torch.algorithm import TorchGRPO  # noqa: E402
from agentbolt_torch.metrics import per_rollout, step_means  # noqa: E402

NAME = "calc_agent"

# AutoGen logs every model call (with its whole prompt) on its event loggers; under a root logger
# at INFO they would flood the output. Not propagating them keeps them off the console while the
# agentbolt-autogen adapter, which reads them through a filter on these loggers, still sees them.
# Module level, so that it also holds in the runner processes (they import this script).
for _events in ("autogen_core.events", "autogen_agentchat.events"):
    logging.getLogger(_events).propagate = False


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2", help="smollm2 (bundled), tiny (random, for smoke runs) or a HF dir")
    p.add_argument("--steps", type=int, default=20, help="training steps (default 20)")
    p.add_argument("--batch-size", type=int, default=8, help="questions per step (default 8)")
    p.add_argument("--group-size", type=int, default=4, help="samples per question (default 4)")
    p.add_argument("--val", type=int, default=100, help="held-out questions (default 100)")
    p.add_argument("--val-every", type=int, default=10, help="evaluate every N steps (default 10)")
    p.add_argument("--max-tokens", type=int, default=48, help="tokens per reply (default 48)")
    p.add_argument("--temperature", type=float, default=0.7, help="sampling temperature, training and held-out (0.7)")
    p.add_argument("--lr", type=float, default=1e-5, help="learning rate (default 1e-5)")
    p.add_argument(
        "--data", default=None, help="a Calc-X folder (train*/test* as .parquet or .jsonl); default: bundled"
    )
    p.add_argument("--autocast", default="auto", help="auto (bf16 where fast, else fp32), bfloat16 or none")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--runners", type=int, default=1, help="runner processes (default 1)")
    p.add_argument("--store", default=f"sqlite:///runs/{NAME}.db", help="store URL")
    p.add_argument("--out", default=f"runs/{NAME}", help="metrics, curve and checkpoint directory")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true", help="log lines instead of progress bars")
    p.add_argument(
        "--write-tasks", metavar="DIR", help="only write tasks.jsonl/val_tasks.jsonl (agentbolt tasks, for verl)"
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        train, val = load(args.data, n_val=args.val)
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.write_tasks:
        folder = Path(args.write_tasks)
        folder.mkdir(parents=True, exist_ok=True)
        for name, tasks in (("tasks.jsonl", train), ("val_tasks.jsonl", val)):
            rows = (Task(task_id=task["task_id"], input=task).model_dump_json() for task in tasks)
            (folder / name).write_text("".join(row + "\n" for row in rows))
        print(f"wrote {len(train)} training and {len(val)} held-out tasks to {folder}")
        return 0
    if args.store.startswith("sqlite:///"):
        Path(args.store.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    algorithm = TorchGRPO(
        args.model,
        steps=args.steps,
        batch_size=args.batch_size,
        group_size=args.group_size,
        temperature=args.temperature,
        max_tokens=args.max_tokens,
        val_every=args.val_every,
        update={"lr": args.lr, "seed": args.seed},
        out_dir=args.out,
        checkpoint_every=args.steps or None,
        autocast=None if args.autocast == "none" else args.autocast,
        device=args.device,
        seed=args.seed,
    )
    trainer = Trainer(
        calc_agent,
        algorithm,
        store=args.store,
        runners=RunnerOptions(n=args.runners, concurrency=args.batch_size * args.group_size, timeout_s=300.0),
        progress=not args.no_progress,
    )
    result = trainer.fit(train, val)
    figures = asyncio.run(run_figures(args.store, steps=result.steps))
    summary = {
        **result.to_dict(),
        "example": NAME,
        "metric": "held-out accuracy",
        **figures,
        "train_minutes": result.seconds_per_step * result.steps / 60,
        **per_rollout(result.history),
    }
    (Path(args.out) / "result.json").write_text(json.dumps(summary, indent=2))

    def fmt(x: float | None, digits: int = 3) -> str:
        return "n/a" if x is None else f"{x:.{digits}f}"

    print(
        f"held-out accuracy {fmt(summary['metric_before'])} +- {fmt(summary['metric_stderr_before'])} -> "
        f"{fmt(summary['metric_after'])} +- {fmt(summary['metric_stderr_after'])} ({summary['n_val']} questions) "
        f"over {result.steps} steps ({result.seconds_per_step:.1f} s/step, {summary['train_minutes']:.1f} min); "
        f"curve: {result.curve_png}",
        flush=True,
    )
    print(
        f"calculator called in {fmt(summary['tool_call_rate_before'])} -> {fmt(summary['tool_call_rate_after'])} "
        f"of held-out rollouts; per training rollout: {fmt(summary['calls_per_rollout'], 2)} LLM calls, "
        f"{fmt(summary['transitions_per_rollout'], 2)} transitions; exact token ids on "
        f"{fmt(summary['exact_token_id_share'])} of {summary['train_llm_calls']} training calls",
        flush=True,
    )
    means = step_means(result.history)
    if means:
        print(
            f"per step (means): rollouts {means.get('time/rollouts_s', 0):.1f} s, update "
            f"{means.get('time/update_s', 0):.1f} s; prompts of {means.get('update/prompt_len_mean', 0):.0f} tokens",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
