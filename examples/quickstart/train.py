"""Quickstart: train SmolLM2-135M-Instruct on arithmetic with GRPO, on CPU, through agentbolt.

    ./dev quickstart                                  # the defaults below (minutes on 2 CPU cores)
    uv run python examples/quickstart/train.py --steps 5 --val 32

    # asynchronous: the next batch's rollouts run while the policy updates (calls at most 1 version stale)
    uv run python examples/quickstart/train.py --async 1

    # SFT, then RL from its weights (--init-from: a checkpoint directory or a Hugging Face model dir)
    uv run python examples/quickstart/train.py --algorithm torch-sft --steps 5 --out runs/quickstart-sft
    uv run python examples/quickstart/train.py --init-from runs/quickstart-sft/checkpoint-final --steps 20

What runs: a SQLite store (``runs/quickstart.db``), the gateway, one runner process executing
the agent of ``agent.py`` 32 rollouts at a time, and ``torch-grpo``, which serves the policy
(exact token ids and logprobs), turns the recorded calls into transitions with LightningRL and
updates the weights. Held-out accuracy (96 fixed questions, one sample each at T=1.0; problems
no training question asks, see ``math_tasks.is_heldout``) is measured before, every
``--val-every`` steps and after; the reward/accuracy curve goes to ``runs/quickstart/curve.png``
and the run record to ``runs/quickstart/result.json`` (the ``docs/runs/`` shape).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # agent.py and math_tasks.py, also in the runner processes

from agent import math_agent, math_agent_no_tool  # noqa: E402
from baselines import trivial_scores  # noqa: E402
from math_tasks import HELDOUT_SET, make_tasks  # noqa: E402
from run_memory import MemoryPeak, RunMemory  # noqa: E402

from agentbolt.errors import UserError  # noqa: E402
from agentbolt.options import RunnerOptions  # noqa: E402
from agentbolt.runs.evaluation import (  # noqa: E402
    RunRecord,
    latest_run,
    mean_and_se,
    provenance,
    read_heldout,
    set_score,
)
from agentbolt.runs.health import run_health  # noqa: E402
from agentbolt.store import open_store  # noqa: E402
from agentbolt.trainer import Trainer  # noqa: E402
from agentbolt_torch.training.algorithm import TorchGRPO  # noqa: E402
from agentbolt_torch.training.asynchronous import add_async_argument, rollouts_in_flight  # noqa: E402
from agentbolt_torch.training.metrics import step_means  # noqa: E402
from agentbolt_torch.training.sft import TorchSFT, model_dir_of  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2", help="smollm2 (bundled), tiny (random, for smoke runs) or a HF dir")
    p.add_argument(
        "--algorithm", choices=["torch-grpo", "torch-sft"], default="torch-grpo", help="GRPO (default) or SFT"
    )
    p.add_argument(
        "--init-from",
        metavar="PATH",
        help="start from these weights instead of --model: a checkpoint directory of an earlier run "
        "(e.g. runs/quickstart-sft/checkpoint-final) or a Hugging Face model directory",
    )
    p.add_argument("--threshold", type=float, default=1.0, help="torch-sft: imitate rollouts with this reward or more")
    p.add_argument("--steps", type=int, default=20, help="training steps (default 20)")
    p.add_argument("--batch-size", type=int, default=8, help="questions per step (default 8)")
    p.add_argument("--group-size", type=int, default=4, help="samples per question (default 4)")
    p.add_argument("--val", type=int, default=96, help="held-out questions (default 96)")
    p.add_argument(
        "--val-every",
        type=int,
        default=5,
        help="evaluate every N steps (default 5; the record gives each evaluation's training seconds and gain)",
    )
    p.add_argument("--max-tokens", type=int, default=40, help="tokens per reply (default 40)")
    p.add_argument("--lr", type=float, default=1e-5, help="learning rate (default 1e-5)")
    p.add_argument(
        "--kl-coef",
        type=float,
        default=0.0,
        help="weight of a KL penalty to the starting weights (k3; default 0: none). Keeps the policy from "
        "sampling almost deterministically (agentbolt doctor: entropy_collapse)",
    )
    p.add_argument(
        "--entropy-coef", type=float, default=0.0, help="weight of an entropy bonus in the update (default 0: none)"
    )
    p.add_argument(
        "--tool",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="offer the agent a calculator tool (default: no tool, one call per question). SmolLM2 does not "
        "call it untrained (agentbolt doctor: tools_never_called); examples/calc_agent teaches a tool first",
    )
    p.add_argument(
        "--micro-batch-tokens",
        type=int,
        default=None,
        help="padded tokens per forward/backward pass of an update (default: the updater's 2048; smaller "
        "takes less memory, see docs/benchmarks.md 'Update memory')",
    )
    p.add_argument(
        "--gradient-checkpointing",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="recompute the layers' activations in the update's backward pass instead of keeping them (default): "
        "about 1.8 GB less memory on SmolLM2 for a 10-20%% slower update; --no-gradient-checkpointing keeps them "
        "(see docs/benchmarks.md 'Allocator')",
    )
    p.add_argument(
        "--generator",
        choices=["own", "vllm"],
        default="own",
        help="what generates: agentbolt's engine (default) or a vLLM server the run starts (./dev setup --vllm "
        "first; docs/generators.md compares them)",
    )
    add_async_argument(p)
    p.add_argument("--autocast", default="auto", help="auto (bf16 where fast, else fp32), bfloat16 or none")
    p.add_argument("--runners", type=int, default=1, help="runner processes (default 1)")
    p.add_argument("--store", default="sqlite:///runs/quickstart.db", help="store URL")
    p.add_argument("--out", default="runs/quickstart", help="metrics, curve and checkpoint directory")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true", help="log lines instead of progress bars")
    args = p.parse_args(argv)
    if args.init_from is not None:
        try:
            args.model = model_dir_of(args.init_from)
        except UserError as exc:
            p.error(f"--init-from: {exc}")
    return args


HELDOUT_ITEMS = "heldout_items.json"
"""Beside ``result.json``: each evaluation's per-question outcomes (:func:`heldout_items`)."""

MEMORY_INTERVAL_S = 0.25
"""How often the run's memory is sampled (:class:`run_memory.RunMemory`)."""


def heldout_items(store_url: str, result: Any) -> dict[str, Any] | None:
    """Each evaluation's per-question outcomes (1 right, 0 not), in task order:
    ``{"set": ..., "task_ids": [...], "stages": {"step 0": [...], "step 5": [...]}}``, the file
    ``heldout_items.json`` beside the record; ``None`` without held-out questions. The record's
    stage scores and paired gains are recomputed from it (tests/examples/test_record_metrics.py)."""
    evaluations = sorted({int(h["step"]) for h in result.history if "val/accuracy" in h})
    if not evaluations:
        return None
    outcomes = asyncio.run(read_heldout(store_url, [f"val{step}" for step in evaluations], spans=False))
    task_ids = [o.task_id for o in outcomes[f"val{evaluations[0]}"]]
    stages: dict[str, list[int]] = {}
    for step in evaluations:
        right = {o.task_id: int(o.score() >= 1.0) for o in outcomes[f"val{step}"]}
        if set(right) != set(task_ids):  # a question without a recorded rollout scores 0, as a failed one does
            logging.getLogger(__name__).warning(
                "the evaluation at step %d scored %d of the first evaluation's %d questions",
                step,
                len(set(right) & set(task_ids)),
                len(task_ids),
            )
        stages[f"step {step}"] = [right.get(task_id, 0) for task_id in task_ids]
    return {"set": HELDOUT_SET, "task_ids": task_ids, "stages": stages}


def run_record(
    args: argparse.Namespace,
    origin: dict[str, str],
    result: Any,
    wall_s: float,
    items: dict[str, Any] | None,
    memory: MemoryPeak | None = None,
) -> RunRecord | None:
    """The run record: held-out accuracy before and after (each evaluation as a stage, with its gain
    over the first in standard errors, independent and paired), from :func:`heldout_items`;
    ``None`` without held-out questions."""
    if items is None:
        return None
    findings = asyncio.run(training_findings(args.store))
    correct = {stage: [float(x) for x in values] for stage, values in items["stages"].items()}
    names = list(correct)
    stages = {}
    trained_s = training_seconds(result.history)
    first = correct[names[0]]
    for name in names:
        mean, se = mean_and_se(correct[name])
        stage = {"score": mean, "se": se}
        if name != names[0]:  # its gains over the first evaluation, as the record's headline gains
            score = set_score("accuracy", first, correct[name])
            for key, z in (("gain_z", score.gain_in_se), ("paired_gain_z", score.paired_gain_in_se)):
                if z is not None and math.isfinite(z):
                    stage[key] = round(z, 2)
        stages[name] = stage | {"training_s": round(trained_s.get(int(name.removeprefix("step ")), 0.0), 1)}
    model = {"smollm2": "SmolLM2-135M-Instruct", "tiny": "tiny (random)"}.get(args.model, Path(args.model).name)
    return RunRecord(
        example="quickstart",
        **origin,
        model=model,
        steps=result.steps,
        wall_s=round(wall_s, 1),
        s_per_step=round(result.seconds_per_step, 1),
        heldout={HELDOUT_SET: set_score("accuracy", first, correct[names[-1]], **stages)},
        headline=f"{HELDOUT_SET}/accuracy",
        extra={
            "algorithm": args.algorithm,
            "tool": args.tool,
            "kl_coef": args.kl_coef,
            "entropy_coef": args.entropy_coef,
            "findings": findings,
            "max_staleness": args.max_staleness,
            **(
                {
                    "peak_rss_gib_run": round(memory.tree_gib, 2),
                    "peak_rss_gib_trainer": round(memory.self_maxrss_gib, 2),
                }
                if memory is not None
                else {}
            ),
            "train_reward": [round(h["train/reward"], 3) for h in result.history if "train/reward" in h],
            **{
                k: round(v, 1)
                for k, v in step_means(result.history).items()
                if k.startswith(("time/", "engine/")) or k == "update/zero_advantage_skipped"
            },
        },
    )


def training_seconds(history: list[dict[str, Any]]) -> dict[int, float]:
    """Seconds of training (the steps' ``time/step_s``: rollouts and update, evaluations and
    loading excluded) the run had spent by the end of each step; step 0 is 0."""
    spent, total = {0: 0.0}, 0.0
    for h in history:
        if "time/step_s" in h:
            total += float(h["time/step_s"])
            spent[int(h["step"])] = total
    return spent


async def training_findings(store_url: str) -> list[str]:
    """The codes of the latest run's training-health findings (``tools_never_called``...), as
    ``agentbolt doctor`` and the run's summary card report them."""
    run_id = await latest_run(store_url)
    if run_id is None:
        return []
    store = open_store(store_url)
    try:
        return [f.code for f in (await run_health(store, run_id)).findings]
    finally:
        await store.close()


def allocator() -> str:
    """The allocator this process runs on (``./dev`` preloads tcmalloc; without it glibc's malloc
    keeps more memory: docs/benchmarks.md "Allocator")."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        maps = ""
    return next((name for name in ("tcmalloc", "jemalloc", "mimalloc") if f"lib{name}" in maps), "glibc malloc")


def peak_memory(peak: MemoryPeak, interval_s: float) -> str:
    """The run's peak memory in GiB: this process and the processes it started (the runner), summed."""
    others = peak.processes - 1
    return (
        f"{peak.tree_gib:.2f} GiB (this process and {others} it started, RSS summed, sampled every {interval_s:g} s); "
        f"this process alone {peak.self_maxrss_gib:.2f} GiB ({allocator()})"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    origin = provenance([sys.argv[0], *(sys.argv[1:] if argv is None else argv)])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    train = make_tasks(4000, seed=1, prefix="train-", heldout=False)
    val = make_tasks(args.val, seed=2, prefix="val-", heldout=True)
    options: dict[str, Any] = {
        "steps": args.steps,
        "batch_size": args.batch_size,
        "group_size": args.group_size,
        "sampling": {"temperature": 1.0, "max_tokens": args.max_tokens},
        "evaluation": {"every": args.val_every},
        "update": {"lr": args.lr, "seed": args.seed}
        | ({"kl_coef": args.kl_coef} if args.kl_coef else {})
        | ({"entropy_coef": args.entropy_coef} if args.entropy_coef else {})
        | ({"micro_batch_tokens": args.micro_batch_tokens} if args.micro_batch_tokens else {})
        | ({"gradient_checkpointing": True} if args.gradient_checkpointing else {}),
        "policy": {"autocast": None if args.autocast == "none" else args.autocast},
        "output": {"out_dir": args.out, "checkpoint_every": args.steps or None},
        "generation": {"generator": args.generator},
        "seed": args.seed,
    }
    if args.algorithm == "torch-sft":
        algorithm: TorchGRPO = TorchSFT(args.model, threshold=args.threshold, **options)
    else:
        algorithm = TorchGRPO(args.model, **options)
    trainer = Trainer(
        math_agent if args.tool else math_agent_no_tool,
        algorithm,
        store=args.store,
        runners=RunnerOptions(
            n=args.runners,
            concurrency=rollouts_in_flight(args.batch_size, args.group_size, args.max_staleness),
            timeout_s=300.0,
        ),
        progress=not args.no_progress,
        # how the run's summary card (agentbolt runs show, the dashboard) names the held-out metric
        run={
            "config": {
                "heldout_metric": {"name": "accuracy", "threshold": 1.0},
                "trivial": {row["policy"]: row["score"] for row in trivial_scores(val=val)} if val else {},
            }
        },
    )
    started = time.time()
    with RunMemory(MEMORY_INTERVAL_S) as memory:
        result = trainer.fit(train, val, max_staleness=args.max_staleness)
    wall_s = time.time() - started
    items = heldout_items(args.store, result)
    record = run_record(args, origin, result, wall_s, items, memory.peak)
    if record is not None:
        record.write(Path(args.out) / "result.json")
        Path(args.out, HELDOUT_ITEMS).write_text(json.dumps(items, separators=(",", ":")) + "\n")
        score = record.heldout[HELDOUT_SET]
        paired = score.paired_gain_in_se
        line = (
            f"held-out accuracy {score.before:.3f} ± {score.before_se:.3f} -> {score.after:.3f} ± "
            f"{score.after_se:.3f} (n={score.n}, gain {score.gain_in_se:+.1f} se"
            + ("" if paired is None or math.isnan(paired) else f", {paired:+.1f} se paired")
            + ")"
        )
        print(line.replace("gain +nan se", "no gain"), flush=True)
    print(
        f"over {result.steps} steps ({result.seconds_per_step:.1f} s/step, {wall_s / 60:.1f} min in all); "
        f"curve: {result.curve_png}",
        flush=True,
    )
    print(f"peak memory of the run: {peak_memory(memory.peak, MEMORY_INTERVAL_S)}", flush=True)
    means = step_means(result.history)
    if means:
        print(
            f"per step (means): rollouts {means.get('time/rollouts_s', 0):.1f} s, update "
            f"{means.get('time/update_s', 0):.1f} s; prompts of {means.get('update/prompt_len_mean', 0):.0f} tokens: "
            f"{means.get('engine/prompt_tokens', 0):,.0f} prompt tokens computed, "
            f"{means.get('engine/cached_prompt_tokens', 0):,.0f} served from the prompt cache; "
            f"{means.get('update/zero_advantage_skipped', 0):.1f} of {means.get('update/n_transitions', 0):.0f} "
            "rows left out of the update (advantage 0: no gradient)",
            flush=True,
        )
    if args.max_staleness is not None and means:
        print(
            f"asynchronous (max_staleness={args.max_staleness}): per step the trainer waited "
            f"{means.get('time/trainer_wait_share', 0):.0%} of the time for rollouts and the rollouts "
            f"{means.get('time/rollouts_wait_share', 0):.0%} for the trainer; mean staleness of trained calls "
            f"{means.get('lightningrl/staleness_mean', 0):.2f}; {result.stale_calls} stale calls dropped",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
