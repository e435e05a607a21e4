"""Teach an AutoGen calculator agent to use its tool: SFT on demonstrations, then GRPO, on CPU.

    uv run python examples/calc_agent/train.py                                   # the published run (SmolLM2)
    uv run python examples/calc_agent/train.py --model tiny --sft-steps 2 --rl-steps 1 --val 4 --demos 8  # smoke run
    uv run python examples/calc_agent/train.py --teacher http://HOST:PORT/v1 --teacher-model NAME  # demos from a stronger model

What runs, in one process (a SQLite store, the gateway, runner processes executing ``agent.py``):

1. **Demonstrations** (:mod:`teacher`): the agent solves training problems against a teacher --
   by default one that replays each problem's Calc-X chain as calculator calls, or any
   OpenAI-compatible endpoint (``--teacher``) -- and the calls of the fully rewarded rollouts are
   kept, exactly as the agent sent and received them.
2. **SFT** (``torch-sft`` with ``demonstrations=``): the demonstrations rendered with the policy's
   tokenizer through the policy server's chat rendering (tools in the prompt, tool calls as
   ``<tool_call>`` text) and trained with NLL. Held-out before = the **base** model, after = **SFT**.
3. **RL** (``torch-grpo`` from the SFT checkpoint): the agent's own rollouts, rewarded by its
   answers. Held-out after = **RL**.

Each held-out tier (bundled: ``small`` and ``large`` numbers) is reported per stage: accuracy ±
standard error and the tool-call rate (share of held-out rollouts that called the calculator).
``--record docs/runs/calc_agent`` publishes the run record (result.json, metrics.jsonl, curve.png).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))  # agent.py, calculator.py, data.py; also in the runner processes

import figures  # noqa: E402
import record  # noqa: E402
from agent import calc_agent  # noqa: E402
from data import DataError, load  # noqa: E402

from agentbolt.options import RunnerOptions  # noqa: E402
from agentbolt.trainer import Trainer  # noqa: E402
from agentbolt.types import Task  # noqa: E402

NAME = "calc_agent"
TEACHER_KEY_ENV = "TEACHER_API_KEY"

# AutoGen logs every model call (with its whole prompt) on its event loggers; under a root logger
# at INFO they would flood the output. Not propagating them keeps them off the console while the
# agentbolt-autogen adapter, which reads them through a filter on these loggers, still sees them.
# Module level, so that it also holds in the runner processes (they import this script).
for _events in ("autogen_core.events", "autogen_agentchat.events"):
    logging.getLogger(_events).propagate = False


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2", help="smollm2 (bundled), tiny (random, for smoke runs) or a HF dir")
    p.add_argument(
        "--data", default=None, help="a Calc-X folder (train*/test* as .parquet or .jsonl); default: bundled"
    )
    p.add_argument("--val", type=int, default=40, help="held-out problems per tier (default 40)")
    p.add_argument(
        "--demos", type=int, default=None, help="training problems to demonstrate (default: sft-steps x sft-batch-size)"
    )
    p.add_argument("--teacher", metavar="URL", help=f"an OpenAI-compatible teacher (key: ${TEACHER_KEY_ENV})")
    p.add_argument("--teacher-model", default=None, help="the teacher's model name")
    p.add_argument("--sft-steps", type=int, default=12, help="SFT steps (default 12; 0: RL from the base model)")
    p.add_argument("--sft-batch-size", type=int, default=16, help="demonstrated problems per SFT step (default 16)")
    p.add_argument("--sft-lr", type=float, default=5e-5, help="SFT learning rate (default 5e-5)")
    p.add_argument("--rl-steps", type=int, default=8, help="GRPO steps (default 8; 0: stop after SFT)")
    p.add_argument("--batch-size", type=int, default=8, help="problems per GRPO step (default 8)")
    p.add_argument("--group-size", type=int, default=4, help="samples per problem (default 4)")
    p.add_argument("--lr", type=float, default=1e-5, help="GRPO learning rate (default 1e-5)")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per model reply (default 64)")
    p.add_argument("--temperature", type=float, default=0.7, help="sampling temperature, training and held-out (0.7)")
    p.add_argument("--autocast", default="auto", help="auto (bf16 where fast, else fp32), bfloat16 or none")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--runners", type=int, default=1, help="runner processes (default 1)")
    p.add_argument("--store", default=f"sqlite:///runs/{NAME}.db", help="store URL")
    p.add_argument("--out", default=f"runs/{NAME}", help="metrics, curves, checkpoints and the run's record")
    p.add_argument("--record", metavar="DIR", help="also copy the record there (e.g. docs/runs/calc_agent)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true", help="log lines instead of progress bars")
    p.add_argument(
        "--write-tasks", metavar="DIR", help="only write tasks.jsonl/val_tasks.jsonl (agentbolt tasks, for verl)"
    )
    try:  # the GRPO stage's --async K (agentbolt-torch; --write-tasks for verl does not need it)
        from agentbolt_torch.training.asynchronous import add_async_argument
    except ImportError:
        p.set_defaults(max_staleness=None)
    else:
        add_async_argument(p)
    args = p.parse_args(argv)
    if args.demos is None:
        args.demos = args.sft_steps * args.sft_batch_size
    if min(args.sft_steps, args.rl_steps, args.demos) < 0 or args.val < 1:
        p.error("--sft-steps, --rl-steps and --demos must be >= 0 and --val >= 1")
    if args.sft_steps == 0 and args.rl_steps == 0:
        p.error("nothing to train: give --sft-steps or --rl-steps")
    return args


def agent_task(task: dict[str, Any]) -> dict[str, Any]:
    """What the agent gets: the question and the answer its reward checks (not the worked chain)."""
    return {k: v for k, v in task.items() if k != "chain"}


def write_tasks(folder: Path, train: list[dict[str, Any]], val: list[dict[str, Any]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, tasks in (("tasks.jsonl", train), ("val_tasks.jsonl", val)):
        rows = (Task(task_id=task["task_id"], input=agent_task(task)).model_dump_json() for task in tasks)
        (folder / name).write_text("".join(row + "\n" for row in rows))
    print(f"wrote {len(train)} training and {len(val)} held-out tasks to {folder}")


def demonstrations(args: argparse.Namespace, train: list[dict[str, Any]]) -> Any:
    from teacher import collect

    tasks = train[: args.demos]
    if args.teacher:
        print(f"demonstrations: {len(tasks)} training problems through the agent against {args.teacher}", flush=True)
    else:
        print(f"demonstrations: {len(tasks)} worked Calc-X chains replayed through the agent", flush=True)
    got = collect(
        calc_agent,
        [agent_task(t) | {"chain": t.get("chain", "")} for t in tasks],
        teacher_url=args.teacher,
        teacher_model=args.teacher_model,
        api_key=os.environ.get(TEACHER_KEY_ENV),
    )
    print(
        f"demonstrations: {got.solved} of {got.problems} problems solved, {len(got.demonstrations)} model calls "
        f"({got.tool_calls} of them calculator calls) in {got.seconds:.0f} s; the teacher gives no token ids: "
        "SFT renders each call for the policy",
        flush=True,
    )
    return got


def _trainer(args: argparse.Namespace, algorithm: Any, run_name: str) -> Trainer:
    in_flight = args.batch_size * args.group_size * (1 + (args.max_staleness or 0))  # rollouts_in_flight
    return Trainer(
        calc_agent,
        algorithm,
        store=args.store,
        runners=RunnerOptions(n=args.runners, concurrency=max(in_flight, 16), timeout_s=600.0),
        progress=not args.no_progress,
        run={"name": run_name},
    )


def _common(args: argparse.Namespace, out: Path, *, checkpoint_every: int, val_before: bool = True) -> dict[str, Any]:
    return {
        "sampling": {"temperature": args.temperature, "max_tokens": args.max_tokens},
        "evaluation": {"every": None, "before": val_before},
        "output": {"out_dir": out, "checkpoint_every": checkpoint_every},
        "policy": {"autocast": None if args.autocast == "none" else args.autocast, "device": args.device},
        "seed": args.seed,
    }


def _passes(run: str, tags: dict[str, str], tier_of: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    return {stage: asyncio.run(figures.heldout_pass(args.store, run, tag, tier_of)) for stage, tag in tags.items()}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    started = time.monotonic()
    try:
        train, tiers = load(args.data, n_val=args.val)
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    val = [task for tasks in tiers.values() for task in tasks]
    if args.write_tasks:
        write_tasks(Path(args.write_tasks), train, val)
        return 0
    from agentbolt_torch.training.algorithm import TorchGRPO
    from agentbolt_torch.training.sft import TorchSFT, model_dir_of

    if args.store.startswith("sqlite:///"):
        Path(args.store.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tier_of = {task["task_id"]: task["tier"] for task in val}
    val_tasks = [agent_task(t) for t in val]
    passes: dict[str, dict[str, figures.PassFigures]] = {}
    metrics: list[dict[str, Any]] = []
    extra: dict[str, Any] = {"tiers": {tier: len(tasks) for tier, tasks in tiers.items()}}
    timing: dict[str, tuple[int, float]] = {}
    model = args.model

    if args.sft_steps:
        got = demonstrations(args, train)
        extra["demonstrations"] = {
            "teacher": args.teacher or "calc-x-chains",
            "problems": got.problems,
            "solved": got.solved,
            "calls": len(got.demonstrations),
            "tool_calls": got.tool_calls,
        }
        if not got.demonstrations:
            print("error: the teacher solved none of the problems: no demonstration to train on", file=sys.stderr)
            return 1
        sft = TorchSFT(
            args.model,
            demonstrations=got.demonstrations,
            steps=args.sft_steps,
            batch_size=args.sft_batch_size,
            update={"lr": args.sft_lr, "seed": args.seed},
            **_common(args, out / "sft", checkpoint_every=args.sft_steps),
        )
        result = _trainer(args, sft, f"{NAME}-sft").fit([], val_tasks)
        run = asyncio.run(figures.latest_run(args.store))
        passes |= _passes(run, {"base": "val0", "sft": f"val{args.sft_steps}"}, tier_of, args)
        metrics += [{"stage": "sft", **r} for r in record.read_jsonl(Path(result.metrics_path))]
        timing["sft"] = (result.steps, result.seconds_per_step)
        model = model_dir_of(result.checkpoint)

    if args.rl_steps:
        grpo = TorchGRPO(
            model,
            steps=args.rl_steps,
            batch_size=args.batch_size,
            group_size=args.group_size,
            update={"lr": args.lr, "seed": args.seed},
            # val_before: the SFT run just measured these weights
            **_common(args, out / "rl", checkpoint_every=args.rl_steps, val_before=not args.sft_steps),
        )
        result = _trainer(args, grpo, f"{NAME}-rl").fit(
            [agent_task(t) for t in train], val_tasks, max_staleness=args.max_staleness
        )
        run = asyncio.run(figures.latest_run(args.store))
        tags = {"rl": f"val{args.rl_steps}"} if args.sft_steps else {"base": "val0", "rl": f"val{args.rl_steps}"}
        passes |= _passes(run, tags, tier_of, args)
        metrics += [{"stage": "rl", **r} for r in record.read_jsonl(Path(result.metrics_path))]
        timing["rl"] = (result.steps, result.seconds_per_step)
        extra["rl_training"] = asyncio.run(figures.training_calls(args.store, run))

    for stage in record.STAGES:
        for tier, fig in passes.get(stage, {}).items():
            metrics.append(
                {"kind": "heldout", "stage": stage, "tier": tier, "val/n": fig.n, "val/accuracy": fig.accuracy}
                | {
                    "val/se": fig.se,
                    "val/tool_call_rate": fig.tool_call_rate,
                    "val/calls_per_rollout": fig.calls_per_rollout,
                }
            )
    stages = {
        tier: {s: passes[s][tier].as_stage() for s in record.STAGES if s in passes and tier in passes[s]}
        for tier in tiers
    }
    steps = sum(n for n, _ in timing.values())
    extra["s_per_step"] = {stage: round(s, 2) for stage, (_, s) in timing.items()}
    extra["settings"] = {k: v for k, v in vars(args).items() if k not in ("store", "out", "record", "no_progress")}
    wall = time.monotonic() - started
    env = [f"{k}={os.environ[k]}" for k in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MKL_NUM_THREADS") if k in os.environ]
    command = shlex.join(
        [*env, "uv", "run", "python", "examples/calc_agent/train.py", *(sys.argv[1:] if argv is None else argv)]
    )
    result_json = record.result(
        command=command,
        repo=REPO,
        model=args.model,
        steps=steps,
        wall_s=wall,
        s_per_step=sum(n * s for n, s in timing.values()) / steps if steps else 0.0,
        tiers=stages,
        n={tier: len(tasks) for tier, tasks in tiers.items()},
        extra=extra,
    )
    record.write(out, result_json, metrics)
    if args.record:
        record.copy_record(out, Path(args.record))
    print_summary(result_json, wall, out)
    return 0


def print_summary(result_json: dict[str, Any], wall: float, out: Path) -> None:
    """The stage table per tier, and the headline comparison (last stage vs base, in standard errors)."""
    print(f"held-out accuracy ± standard error (tool-call rate) per tier; {wall / 60:.1f} min in all; record: {out}")
    print(f"{'tier':6} {'n':>4}  " + "  ".join(f"{s:>22}" for s in record.STAGES))
    for tier, entry in result_json["heldout"].items():
        cells = []
        for stage in record.STAGES:
            fig = entry["stages"].get(stage)
            cells.append(
                f"{fig['score']:.3f} ± {fig['se']:.3f} ({fig['tool_call_rate']:.2f})" if fig else "n/a".rjust(22)
            )
        print(f"{tier:6} {entry['n']:>4}  " + "  ".join(f"{c:>22}" for c in cells))
    for tier, entry in result_json["heldout"].items():
        diff = entry["after"] - entry["before"]
        se = math.sqrt(entry["after_se"] ** 2 + entry["before_se"] ** 2)
        ratio = f"{diff / se:.1f}" if se > 0 else ("n/a" if diff == 0 else "inf")
        print(f"{tier}: last stage - base = {diff:+.3f} ({ratio} standard errors of the difference)")
    print(json.dumps({"s_per_step": result_json["extra"]["s_per_step"]}))


if __name__ == "__main__":
    sys.exit(main())
