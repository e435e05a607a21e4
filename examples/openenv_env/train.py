"""Train SmolLM2-135M-Instruct on an OpenEnv environment server with GRPO, on CPU, through agentbolt.

    uv run python examples/openenv_env/train.py                  # the defaults below
    uv run python examples/openenv_env/train.py --model tiny --steps 1 --val 4   # a smoke run

What runs: the arithmetic environment of ``openenv_arith.py`` served by OpenEnv (its Python server
mode, a subprocess on 127.0.0.1; ``--env-url`` uses a server you started), a SQLite store, the
gateway, one runner process running :func:`agent.arith_agent` (agentbolt-openenv's ReAct loop:
one OpenEnv session per rollout, two questions per episode, the model called through the
gateway), and ``torch-grpo``. The reward is the episode's return (the fraction of its two
questions answered right). Held-out accuracy (the share of ``--val`` episodes of the ``test``
split, whose problems the ``train`` split never asks, with both questions right) and the mean
return are measured before and after; the record goes to ``runs/openenv_env/result.json`` (the
``docs/runs/`` shape).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # agent.py and openenv_arith.py, also in the runner processes

# A runner process (spawned) imports this module again to unpickle the agent: only what the agent
# needs is imported here; torch, the trainer and the environment (OpenEnv) load in main().
from agent import arith_agent  # noqa: E402

from agentbolt.runs.evaluation import RunRecord, mean_and_se, provenance, read_heldout, set_score  # noqa: E402
from agentbolt_openenv import OpenEnvServerError, check_server, seed_tasks  # noqa: E402

log = logging.getLogger("openenv_env")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2", help="smollm2 (bundled), tiny (random, for smoke runs) or a HF dir")
    p.add_argument("--steps", type=int, default=10, help="training steps (default 10)")
    p.add_argument("--batch-size", type=int, default=4, help="episodes (seeds) per step (default 4)")
    p.add_argument("--group-size", type=int, default=4, help="rollouts per seed (default 4)")
    p.add_argument("--val", type=int, default=32, help="held-out episodes (default 32, two questions each)")
    p.add_argument("--val-every", type=int, default=0, help="evaluate every N steps (default 0: before and after)")
    p.add_argument("--max-tokens", type=int, default=24, help="tokens per reply (default 24)")
    p.add_argument("--lr", type=float, default=1e-5, help="learning rate (default 1e-5)")
    p.add_argument("--env-url", help="an OpenEnv server already running (default: start openenv_arith.py here)")
    p.add_argument("--runners", type=int, default=1, help="runner processes (default 1)")
    p.add_argument("--store", default="sqlite:///runs/openenv_env.db", help="store URL")
    p.add_argument("--out", default="runs/openenv_env", help="metrics, curve and checkpoint directory")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true", help="log lines instead of progress bars")
    return p.parse_args(argv)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def environment_server(url: str | None, sessions: int, timeout_s: float = 300.0) -> Any:
    """The URL of the OpenEnv server: ``url`` as given, or ``openenv_arith.py`` started here (and stopped after)."""
    if url is not None:
        check_server(url)
        yield url
        return
    port = _free_port()
    cmd = [sys.executable, str(HERE / "openenv_arith.py"), "--port", str(port), "--max-concurrent-envs", str(sessions)]
    cmd += ["--parent-pid", str(os.getpid())]  # the server dies with this process, even at kill -9
    proc = subprocess.Popen(cmd)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                check_server(url, timeout_s=5.0)
                break
            except OpenEnvServerError:
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"the environment server exited with {proc.returncode}: {' '.join(cmd)}"
                    ) from None
                if time.monotonic() > deadline:
                    raise
                time.sleep(1.0)
        log.info("OpenEnv server up at %s", url)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def run_record(args: argparse.Namespace, origin: dict[str, str], result: Any, wall_s: float) -> RunRecord | None:
    """Held-out accuracy before and after, with standard errors: the share of held-out episodes
    with every question answered right (return 1.0; torch-grpo's ``val/accuracy``). The mean
    episode return (the share of questions answered right) is in ``extra``."""
    from agentbolt_torch.training.metrics import step_means

    tags = [f"val{step}" for step in sorted({int(h["step"]) for h in result.history if "val/accuracy" in h})]
    if not tags:
        return None
    outcomes = asyncio.run(read_heldout(args.store, tags, spans=False))
    returns = {
        tag: [o.reward if o.succeeded and o.reward is not None else 0.0 for o in found]
        for tag, found in outcomes.items()
    }
    solved = {tag: [float(r >= 1.0 - 1e-9) for r in values] for tag, values in returns.items()}
    stages = {}
    for tag in tags:
        mean, se = mean_and_se(solved[tag])
        stages[f"step {tag.removeprefix('val')}"] = {"score": mean, "se": se}
    model = {"smollm2": "SmolLM2-135M-Instruct", "tiny": "tiny (random)"}.get(args.model, Path(args.model).name)
    return RunRecord(
        example="openenv_env",
        **origin,
        model=model,
        steps=result.steps,
        wall_s=round(wall_s, 1),
        s_per_step=round(result.seconds_per_step, 1),
        heldout={"heldout": set_score("accuracy", solved[tags[0]], solved[tags[-1]], **stages)},
        headline="heldout/accuracy",
        extra={
            "environment": "OpenEnv server (examples/openenv_env/openenv_arith.py), agentbolt-openenv ReActLoop",
            "reward_rule": "sum",
            "questions_per_episode": 2,
            "heldout_mean_return": {
                f"step {tag.removeprefix('val')}": round(mean_and_se(returns[tag])[0], 4) for tag in tags
            },
            "train_reward": [round(h["train/reward"], 3) for h in result.history if "train/reward" in h],
            **{k: round(v, 1) for k, v in step_means(result.history).items() if k.startswith("time/")},
        },
    )


def main(argv: list[str] | None = None) -> int:
    from baselines import trivial_scores

    from agentbolt.options import RunnerOptions
    from agentbolt.trainer import Trainer
    from agentbolt_torch.training.algorithm import TorchGRPO

    args = parse_args(argv)
    origin = provenance([sys.argv[0], *(sys.argv[1:] if argv is None else argv)])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    train = seed_tasks(range(4000), split="train", prefix="train-")
    val = seed_tasks(range(args.val), split="test", prefix="val-")
    in_flight = args.batch_size * args.group_size
    algorithm = TorchGRPO(
        args.model,
        steps=args.steps,
        batch_size=args.batch_size,
        group_size=args.group_size,
        sampling={"temperature": 1.0, "max_tokens": args.max_tokens},
        evaluation={"every": args.val_every or None},
        update={"lr": args.lr, "seed": args.seed, "gradient_checkpointing": True},
        output={"out_dir": args.out, "checkpoint_every": None},
        seed=args.seed,
    )
    with environment_server(args.env_url, sessions=max(in_flight, args.val) + 8) as url:
        trainer = Trainer(
            arith_agent(url),
            algorithm,
            store=args.store,
            runners=RunnerOptions(n=args.runners, concurrency=max(in_flight, 16), timeout_s=300.0),
            progress=not args.no_progress,
            run={"config": {"trivial": {row["policy"]: row["score"] for row in trivial_scores(n=args.val)}}},
        )
        started = time.time()
        result = trainer.fit(train, val)
        wall_s = time.time() - started
    record = run_record(args, origin, result, wall_s)
    if record is not None:
        record.write(Path(args.out) / "result.json")
        score = record.heldout["heldout"]
        print(
            f"held-out episodes solved {score.before:.3f} ± {score.before_se:.3f} -> {score.after:.3f} ± "
            f"{score.after_se:.3f} (n={score.n}, gain {score.gain_in_se:+.1f} se); mean return (questions right) "
            + " -> ".join(f"{v:.3f}" for v in record.extra["heldout_mean_return"].values()),
            flush=True,
        )
    print(f"over {result.steps} steps ({result.seconds_per_step:.1f} s/step, {wall_s / 60:.1f} min in all)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
