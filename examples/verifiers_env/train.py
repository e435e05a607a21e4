"""Train SmolLM2-135M-Instruct on a verifiers environment (``add_env``, written with verifiers'
own API) with GRPO on CPU, through agentbolt and agentbolt-verifiers.

    uv run python examples/verifiers_env/train.py                     # SmolLM2, the defaults below
    uv run python examples/verifiers_env/train.py --model tiny --steps 2 --val 4   # a smoke run

What runs: the environment's own episodes (verifiers' ``null`` chat harness in the
``subprocess`` runtime, its interception relaying each model call) with the model client on
agentbolt's gateway, one in-process runner, a SQLite store and ``torch-grpo``, which serves the
policy with exact token ids and trains on the environment's ``correct`` reward. Held-out accuracy
(``--val`` questions of the ``heldout`` split, which no training question asks) is measured before,
every ``--val-every`` steps and after; the record goes to ``--out``/result.json (the
``docs/runs/`` shape).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the add_env package

from baselines import trivial_scores  # noqa: E402

from agentbolt.options import RunnerOptions  # noqa: E402
from agentbolt.runs.evaluation import RunRecord, mean_and_se, provenance, read_heldout, set_score  # noqa: E402
from agentbolt.trainer import Trainer  # noqa: E402
from agentbolt_torch.training.algorithm import TorchGRPO  # noqa: E402
from agentbolt_torch.training.metrics import step_means  # noqa: E402
from agentbolt_verifiers import load_environment, tasks  # noqa: E402

HARNESS = {"harness": {"id": "null"}}
"""verifiers' tool-less chat harness (the environment has no tools); the runtime defaults to subprocess."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2", help="smollm2 (bundled), tiny (random, for smoke runs) or a HF dir")
    p.add_argument("--steps", type=int, default=8, help="training steps (default 8)")
    p.add_argument("--batch-size", type=int, default=6, help="questions per step (default 6)")
    p.add_argument("--group-size", type=int, default=4, help="samples per question (default 4)")
    p.add_argument("--val", type=int, default=48, help="held-out questions (default 48)")
    p.add_argument("--val-every", type=int, default=8, help="evaluate every N steps (default 8: before and after)")
    p.add_argument("--max-tokens", type=int, default=32, help="tokens per reply (default 32)")
    p.add_argument("--lr", type=float, default=1e-5, help="learning rate (default 1e-5)")
    p.add_argument("--store", default="sqlite:///runs/verifiers_env.db", help="store URL")
    p.add_argument("--out", default="runs/verifiers_env", help="metrics, curve and checkpoint directory")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true", help="log lines instead of progress bars")
    return p.parse_args(argv)


def run_record(args: argparse.Namespace, origin: dict[str, str], result: Any, wall_s: float) -> RunRecord | None:
    """Held-out accuracy before and after (each evaluation a stage), with standard errors."""
    tags = [f"val{step}" for step in sorted({int(h["step"]) for h in result.history if "val/accuracy" in h})]
    if not tags:
        return None
    outcomes = asyncio.run(read_heldout(args.store, tags, spans=False))
    correct = {tag: [float(o.score() >= 1.0) for o in found] for tag, found in outcomes.items()}
    stages = {}
    for tag in tags:
        mean, se = mean_and_se(correct[tag])
        stages[f"step {tag.removeprefix('val')}"] = {"score": mean, "se": se}
    model = {"smollm2": "SmolLM2-135M-Instruct", "tiny": "tiny (random)"}.get(args.model, Path(args.model).name)
    return RunRecord(
        example="verifiers_env",
        **origin,
        model=model,
        steps=result.steps,
        wall_s=round(wall_s, 1),
        s_per_step=round(result.seconds_per_step, 1),
        heldout={"heldout": set_score("accuracy", correct[tags[0]], correct[tags[-1]], **stages)},
        headline="heldout/accuracy",
        extra={
            "environment": "add-env (verifiers 0.4, null harness, subprocess runtime)",
            "train_reward": [round(h["train/reward"], 3) for h in result.history if "train/reward" in h],
            **{k: round(v, 1) for k, v in step_means(result.history).items() if k.startswith("time/")},
        },
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    origin = provenance([sys.argv[0], *(sys.argv[1:] if argv is None else argv)])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "aiohttp.access", "verifiers", "uvicorn"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    env = load_environment("add-env", agent=HARNESS, taskset={"split": "train", "seed": args.seed})
    train = tasks(env)
    val = tasks(load_environment("add-env", agent=HARNESS, taskset={"split": "heldout"}), limit=args.val)
    algorithm = TorchGRPO(
        args.model,
        steps=args.steps,
        batch_size=args.batch_size,
        group_size=args.group_size,
        sampling={"temperature": 1.0, "max_tokens": args.max_tokens},
        evaluation={"every": args.val_every},
        update={"lr": args.lr, "seed": args.seed},
        output={"out_dir": args.out, "checkpoint_every": None},
        seed=args.seed,
    )
    val_rows = [{"question": v.input["prompt"][-1]["content"], "answer": v.input["answer"]} for v in val]
    trainer = Trainer(
        env,  # the verifiers environment itself is the agent
        algorithm,
        store=args.store,
        runners=RunnerOptions(n=0, concurrency=args.batch_size * args.group_size, timeout_s=600.0),
        progress=not args.no_progress,
        run={
            "config": {
                "heldout_metric": {"name": "accuracy", "threshold": 1.0},
                "trivial": {row["policy"]: row["score"] for row in trivial_scores(val=val_rows)} if val else {},
            }
        },
    )
    started = time.time()
    result = trainer.fit(train, val)
    wall_s = time.time() - started
    record = run_record(args, origin, result, wall_s)
    if record is not None:
        record.write(Path(args.out) / "result.json")
        score = record.heldout["heldout"]
        print(
            f"held-out accuracy {score.before:.3f} ± {score.before_se:.3f} -> {score.after:.3f} ± "
            f"{score.after_se:.3f} (n={score.n})",
            flush=True,
        )
    print(f"over {result.steps} steps ({result.seconds_per_step:.1f} s/step, {wall_s / 60:.1f} min in all)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
