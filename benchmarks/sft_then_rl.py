"""SFT, then RL, on the quickstart's arithmetic task (CPU, SmolLM2-135M-Instruct).

Run (long: uses SmolLM2; not part of CI):

    uv run python benchmarks/sft_then_rl.py [--sft-steps 5] [--rl-steps 5] [--val 48]

1. ``torch-sft`` (rejection sampling): each step, 8 questions x 4 samples at T=1.0 through the
   quickstart agent; the transitions of correct answers (reward 1.0) are trained on (NLL of the
   recorded response tokens, lr 1e-5); checkpoint at the end.
2. ``torch-grpo`` from the SFT checkpoint's weights, same batches and sampling.

Held-out accuracy (one sample per question of ``--val`` fixed questions at T=1.0, with its
standard error) before SFT, after SFT (measured twice: at the end of SFT and again at the start
of GRPO, same weights, fresh samples) and after SFT + GRPO is printed, with seconds per step of
each phase.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples" / "quickstart"))

from math_tasks import make_tasks  # noqa: E402

from agentbolt.options import RunnerOptions  # noqa: E402

BATCH, GROUP, MAX_NEW, LR, SEED = 8, 4, 40, 1e-5, 0


def _fit(algorithm: Any, db: Path, n_val: int) -> Any:
    from agent import math_agent_no_tool

    from agentbolt.trainer import Trainer

    trainer = Trainer(
        math_agent_no_tool,
        algorithm,
        store=f"sqlite:///{db}",
        runners=RunnerOptions(n=1, concurrency=BATCH * GROUP),
        progress=False,
    )
    return trainer.fit(
        make_tasks(4000, seed=1, prefix="train-", heldout=False), make_tasks(n_val, seed=2, prefix="val-", heldout=True)
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sft-steps", type=int, default=5)
    p.add_argument("--rl-steps", type=int, default=5)
    p.add_argument("--val", type=int, default=48)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--out", type=Path, default=REPO / "runs" / "bench-sft-then-rl")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    db = args.out / "runs.db"
    for suffix in ("", "-wal", "-shm", "-agentbolt-lock"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)

    from agentbolt_torch.training.algorithm import TorchGRPO
    from agentbolt_torch.training.sft import TorchSFT

    common: dict[str, Any] = {
        "batch_size": BATCH,
        "group_size": GROUP,
        "sampling": {"temperature": 1.0, "max_tokens": MAX_NEW},
        "evaluation": {"every": None},
        "seed": SEED,
    }
    sft = _fit(
        TorchSFT(
            args.model,
            steps=args.sft_steps,
            threshold=1.0,
            update={"lr": LR, "seed": SEED},
            output={"out_dir": args.out / "sft", "checkpoint_every": args.sft_steps, "plot": False},
            **common,
        ),
        db,
        args.val,
    )
    print(
        f"SFT  {args.sft_steps} steps: held-out accuracy {sft.accuracy_before:.3f} -> {sft.accuracy_after:.3f} "
        f"({sft.seconds_per_step:.1f} s/step, {sft.steps} updates)",
        flush=True,
    )
    rl = _fit(
        TorchGRPO(
            str(Path(sft.checkpoint) / "model"),
            steps=args.rl_steps,
            update={"lr": LR, "seed": SEED},
            output={"out_dir": args.out / "grpo", "plot": False},
            **common,
        ),
        db,
        args.val,
    )
    kept = [h["train/kept_rollouts"] for h in sft.history if "train/kept_rollouts" in h]
    print(
        f"GRPO {args.rl_steps} steps from the SFT weights: held-out accuracy {rl.accuracy_before:.3f} -> "
        f"{rl.accuracy_after:.3f} ({rl.seconds_per_step:.1f} s/step)"
    )
    n = args.val

    def acc(p: float) -> str:  # accuracy ± its standard error over the held-out questions
        return f"{p:.3f} ± {math.sqrt(p * (1 - p) / n):.3f}"

    print(
        f"{args.model}, {BATCH}x{GROUP} samples per step, {n} held-out questions at T=1.0: "
        f"base {acc(sft.accuracy_before)} -> SFT {acc(sft.accuracy_after)} "
        f"(re-measured before GRPO: {acc(rl.accuracy_before)}) -> SFT+GRPO {acc(rl.accuracy_after)}; "
        f"SFT kept {statistics.fmean(kept) if kept else 0:.1f} of {BATCH * GROUP} rollouts per step"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
