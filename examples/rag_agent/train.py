"""RAG agent: train SmolLM2-135M-Instruct to search and answer 2-hop questions, on CPU, through agentbolt.

    uv run python examples/rag_agent/train.py                       # the defaults below
    uv run python examples/rag_agent/train.py --steps 0 --val 48    # only measure the base model
    uv run python examples/rag_agent/train.py --data ~/musique/data # the real MuSiQue files

What runs: the bundled MuSiQue-format data set (generated once into ``--cache-dir``) or the
real one (``--data``), an SQLite FTS5 index over its paragraphs (built once, cached, rebuilt
when the corpus changes), a SQLite store (``runs/rag_agent.db``), the gateway, runner
processes executing the OpenAI Agents SDK agent of ``agent.py``, and ``torch-grpo`` (policy
server with exact token ids, LightningRL, GRPO update). The held-out metric is exact match
(SQuAD normalisation, any alias) over the dev questions (all, or the first ``--val``), one
sample each, before and after training, with its standard error; answer F1 beside it. The
training reward is ``0.1 * format + 0.9 * F1`` (``reward.py``). The run record goes to
``--out``/result.json (the ``docs/runs/`` shape).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import logging
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # agent.py, data.py, ..., also in the runner processes

from agent import rag_agent  # noqa: E402
from data import corpus, load_split, to_tasks, write_bundled  # noqa: E402
from figures import run_figures  # noqa: E402
from retrieval import build_index  # noqa: E402

from agentbolt.options import GatewayOptions, RunnerOptions  # noqa: E402
from agentbolt.runs.evaluation import RunRecord, SetScore, provenance  # noqa: E402
from agentbolt.trainer import Trainer  # noqa: E402
from agentbolt.types import Task  # noqa: E402
from agentbolt_torch.training.algorithm import TorchGRPO  # noqa: E402
from agentbolt_torch.training.asynchronous import add_async_argument, rollouts_in_flight  # noqa: E402
from agentbolt_torch.training.metrics import per_rollout, step_means  # noqa: E402

DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "agentbolt/examples/rag_agent"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--model",
        default="smollm2",
        help="smollm2 (bundled) or a HF model dir (tiny's 1,024-token context is too short here)",
    )
    p.add_argument("--steps", type=int, default=12, help="training steps (default 12)")
    p.add_argument("--batch-size", type=int, default=6, help="questions per step (default 6)")
    p.add_argument("--group-size", type=int, default=4, help="samples per question (default 4)")
    p.add_argument("--val", type=int, default=0, help="held-out questions, the first N of dev (default 0: all)")
    p.add_argument("--val-every", type=int, default=0, help="evaluate every N steps (default 0: before/after only)")
    p.add_argument("--max-tokens", type=int, default=48, help="tokens per reply (default 48)")
    p.add_argument("--lr", type=float, default=1e-5, help="learning rate (default 1e-5)")
    p.add_argument("--data", type=Path, help="a MuSiQue data folder (musique_ans_v1.0_{train,dev}.jsonl)")
    p.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE, help=f"bundled data and index ({DEFAULT_CACHE})")
    p.add_argument("--autocast", default="auto", help="auto (bf16 where fast, else fp32), bfloat16 or none")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--runners", type=int, default=1, help="runner processes (default 1)")
    add_async_argument(p)
    p.add_argument("--store", default="sqlite:///runs/rag_agent.db", help="store URL")
    p.add_argument("--out", default="runs/rag_agent", help="metrics, curve and checkpoint directory")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--timeout", type=float, default=900.0, help="seconds per rollout attempt before it is stopped (default 900)"
    )
    p.add_argument("--no-progress", action="store_true", help="log lines instead of progress bars")
    p.add_argument("--export-tasks", type=Path, help="write train.jsonl/val.jsonl (agentbolt tasks, for verl) and exit")
    return p.parse_args(argv)


def model_name(model: str) -> str:
    return {"smollm2": "SmolLM2-135M-Instruct", "tiny": "tiny (random)"}.get(model, Path(model).name)


def prepare(data: Path | None, cache_dir: Path, n_val: int) -> tuple[list[dict], list[dict], Path]:
    """Train and held-out tasks and the search index over the whole corpus (train + dev paragraphs)."""
    if data is None:
        folder, index_name = write_bundled(cache_dir / "data"), "bundled"
    else:
        folder = data.expanduser().resolve()
        index_name = hashlib.sha256(str(folder).encode()).hexdigest()[:16]
    train, dev = load_split(folder, "train"), load_split(folder, "dev")
    index_path = cache_dir / "index" / f"{index_name}.fts5.sqlite"
    paragraphs = corpus([*train, *dev])
    if build_index(paragraphs, index_path):
        print(f"built the search index: {len(paragraphs):,} paragraphs -> {index_path}", flush=True)
    return to_tasks(train, index_path), to_tasks(dev[: n_val or None], index_path), index_path


def export_tasks(folder: Path, train: list[dict], val: list[dict]) -> None:
    """The tasks as JSON Lines of :class:`agentbolt.types.Task` (what agentbolt-verl's ``data.train`` reads)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, tasks in (("train", train), ("val", val)):
        lines = [Task(task_id=task["task_id"], input=task).model_dump_json() + "\n" for task in tasks]
        (folder / f"{name}.jsonl").write_text("".join(lines), encoding="utf-8")
        print(f"wrote {len(lines)} tasks to {folder / f'{name}.jsonl'}", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    origin = provenance([sys.argv[0], *(sys.argv[1:] if argv is None else argv)], device=args.device)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.store.startswith("sqlite:///"):
        Path(args.store.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    train, val, _ = prepare(args.data, args.cache_dir, args.val)
    if args.export_tasks:
        export_tasks(args.export_tasks, train, val)
        return 0
    algorithm = TorchGRPO(
        args.model,
        steps=args.steps,
        batch_size=args.batch_size,
        group_size=args.group_size,
        sampling={"temperature": 1.0, "max_tokens": args.max_tokens},
        evaluation={"every": args.val_every},
        policy={"autocast": None if args.autocast == "none" else args.autocast, "device": args.device},
        output={"out_dir": args.out, "checkpoint_every": args.steps or None},
        update={"lr": args.lr, "seed": args.seed},
        seed=args.seed,
    )
    trainer = Trainer(
        rag_agent,
        algorithm,
        store=args.store,
        runners=RunnerOptions(
            n=args.runners,
            concurrency=rollouts_in_flight(args.batch_size, args.group_size, args.max_staleness),
            timeout_s=args.timeout,
        ),
        # a loaded CPU answers slowly: wait, rather than fail and retry the rollout
        gateway=GatewayOptions(upstream_timeout_s=args.timeout),
        progress=not args.no_progress,
    )
    started = time.time()
    result = trainer.fit(train, val, max_staleness=args.max_staleness)
    wall_s = time.time() - started
    figures = asyncio.run(run_figures(args.store, args.steps))
    counts = per_rollout(result.history)
    stages = figures["stages"]
    before, after = stages["before"], stages["after"]
    record = RunRecord(
        example="rag_agent",
        **origin,
        model=model_name(args.model),
        steps=result.steps,
        wall_s=round(wall_s, 1),
        s_per_step=round(result.seconds_per_step, 1),
        heldout={
            "dev": SetScore(
                metric="exact_match",
                n=figures["n"],
                before=before["score"],
                before_se=before["se"],
                after=after["score"],
                after_se=after["se"],
                stages=stages,
            )
        },
        headline="dev/exact_match",
        extra={
            "reward": "0.1 * format + 0.9 * F1 (training); the held-out metric is exact match, F1 beside it",
            "calls_per_rollout": counts["calls_per_rollout"],
            "transitions_per_rollout": counts["transitions_per_rollout"],
            "exact_token_id_share": figures["exact_token_id_share"],
            # steps whose rollouts gave no transition (e.g. every rollout timed out): no update was made
            "skipped_steps": [int(h["step"]) for h in result.history if h.get("train/skipped")],
            "failed_train_rollouts": int(sum(h.get("train/failed", 0.0) for h in result.history)),
            "train_reward": [round(h["train/reward"], 3) for h in result.history if "train/reward" in h],
        },
    )
    record.write(out / "result.json")

    def fmt(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.3f}"

    score = record.heldout["dev"]
    print(
        f"held-out exact match {score.before:.3f} ± {score.before_se:.3f} -> {score.after:.3f} ± "
        f"{score.after_se:.3f} (n={score.n}, gain {score.gain_in_se:+.1f} se); answer F1 {before['f1']:.3f} ± "
        f"{before['f1_se']:.3f} -> {after['f1']:.3f} ± {after['f1_se']:.3f}; failed rollouts "
        f"{before['failed']:.0f} / {after['failed']:.0f}".replace("gain +nan se", "no gain"),
        flush=True,
    )
    print(
        f"over {result.steps} steps ({result.seconds_per_step:.1f} s/step, {wall_s / 60:.1f} min in all); "
        f"record: {out / 'result.json'}; curve: {result.curve_png}",
        flush=True,
    )
    print(
        f"search called in {fmt(before['tool_call_rate'])} -> {fmt(after['tool_call_rate'])} of held-out questions; "
        f"per training rollout: {fmt(counts['calls_per_rollout'])} LLM calls, "
        f"{fmt(counts['transitions_per_rollout'])} transitions; exact token ids on "
        f"{fmt(figures['exact_token_id_share'])} of the calls",
        flush=True,
    )
    print(
        f"steps without an update (no transition): {record.extra['skipped_steps'] or 'none'}; failed training "
        f"rollouts: {record.extra['failed_train_rollouts']}",
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
