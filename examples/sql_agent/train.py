"""Train the LangGraph SQL agent (write -> execute -> check -> rewrite) with GRPO, on CPU, through agentbolt.

    uv run python examples/sql_agent/train.py                      # the defaults below (SmolLM2-135M, CPU)
    uv run python examples/sql_agent/train.py --steps 0 --val 48   # held-out accuracy of the base model only
    uv run python examples/sql_agent/train.py --data ~/spider      # the real Spider (train_spider.json, dev.json)
    uv run python examples/sql_agent/train.py --train-agents all   # also train the checker
    uv run python examples/sql_agent/train.py --policies per-role  # one LoRA adapter for the writer, one for the rewriter

What runs: a SQLite store (``runs/sql_agent.db``), the gateway, runner processes executing the
graph of ``agent.py`` (the agentbolt-langchain adapter names every LLM call after its graph
node), and ``torch-grpo``, which serves the policy, turns the calls of the selected nodes into
transitions with LightningRL (``agent_match``: by default ``write_query`` and ``rewrite_query``;
``check_query`` calls are recorded but not trained) and updates the weights. The held-out metric
is execution accuracy (one sample per question, before and after training) on each held-out set
of ``dev.json``: ``seen_dbs`` (new questions on training databases) and ``unseen_dbs`` (databases
with no training question). The run record goes to ``--out``/result.json (``docs/runs/`` shape).

``--policies shared`` (the default) trains one policy for every trained node: the full model, or
one LoRA adapter with ``--lora-rank``. ``--policies per-role`` trains one LoRA adapter per role on
one base model (``roles.py``: the writer's and the rewriter's; the checker is served by the base
model), routed by the gateway from what each request carries.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import resource
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # agent.py and data.py, also in the runner processes

from agent import sql_agent  # noqa: E402
from data import HELDOUT_PER_SET, SpiderDataError, ensure_bundled, heldout_sets, load_split  # noqa: E402
from roles import policies_for, sql_role  # noqa: E402

from agentbolt.lightningrl import LightningRLConfig  # noqa: E402
from agentbolt.options import CaptureOptions, GatewayOptions, RunnerOptions  # noqa: E402
from agentbolt.runs.evaluation import RunRecord, provenance, read_heldout, set_score  # noqa: E402
from agentbolt.trainer import Trainer  # noqa: E402
from agentbolt_torch.training.algorithm import TorchGRPO  # noqa: E402
from agentbolt_torch.training.asynchronous import add_async_argument, rollouts_in_flight  # noqa: E402
from agentbolt_torch.training.metrics import per_rollout, step_means  # noqa: E402

AGENT_SETS = {
    "writer+rewriter": "^(write_query|rewrite_query)$",
    "writer": "^write_query$",
    "all": None,
}


DEFAULT_RANK = 16
"""LoRA rank of the per-role adapters when ``--lora-rank`` is not given."""


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2", help="smollm2 (bundled), tiny (random, for smoke runs) or a HF dir")
    p.add_argument("--steps", type=int, default=16, help="training steps (default 16)")
    p.add_argument("--batch-size", type=int, default=8, help="questions per step (default 8)")
    p.add_argument("--group-size", type=int, default=4, help="samples per question (default 4)")
    p.add_argument(
        "--val",
        type=int,
        default=HELDOUT_PER_SET,
        help=f"held-out questions per held-out set, the first N (0: all; default {HELDOUT_PER_SET})",
    )
    p.add_argument("--val-every", type=int, default=0, help="also evaluate every N steps (default 0: before/after)")
    p.add_argument("--max-tokens", type=int, default=40, help="tokens per reply (default 40)")
    p.add_argument("--temperature", type=float, default=0.7, help="sampling temperature, training and held-out")
    p.add_argument(
        "--lr", type=float, default=None, help="learning rate (default 1e-5 full fine-tune, 1e-4 with LoRA adapters)"
    )
    p.add_argument(
        "--policies",
        choices=("shared", "per-role"),
        default="shared",
        help="shared (default): one trained policy for every trained node; per-role: one LoRA adapter per role "
        "(writer, rewriter) on one base model",
    )
    p.add_argument(
        "--lora-rank",
        type=positive_int,
        default=None,
        help="LoRA rank: with --policies shared, train one adapter instead of the full model; "
        f"per-role adapters default to {DEFAULT_RANK}",
    )
    p.add_argument(
        "--train-agents",
        default="writer+rewriter",
        help="graph nodes to train: writer+rewriter (default, the paper's choice), writer, all, or a regex",
    )
    p.add_argument("--data", default=None, help="a Spider folder (train_spider.json, dev.json, tables.json, database/)")
    p.add_argument("--autocast", default="auto", help="auto (bf16 where fast, else fp32), bfloat16 or none")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--runners", type=int, default=1, help="runner processes (default 1)")
    add_async_argument(p)
    p.add_argument(
        "--timeout", type=float, default=1800.0, help="seconds per rollout attempt before it is stopped (default 1800)"
    )
    p.add_argument("--store", default="sqlite:///runs/sql_agent.db", help="store URL")
    p.add_argument("--out", default="runs/sql_agent", help="metrics, curve and checkpoint directory")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true", help="log lines instead of progress bars")
    return p.parse_args(argv)


METRIC = "execution_accuracy"


def model_name(model: str) -> str:
    return {"smollm2": "SmolLM2-135M-Instruct", "tiny": "tiny (random)"}.get(model, Path(model).name)


def capture_figures(store_url: str, since: float, history: list[dict[str, float]]) -> dict[str, float | None]:
    """Calls and transitions per training rollout (LightningRL's step metrics) and the exact-id share."""
    import asyncio

    from agentbolt.algorithm import summarize
    from agentbolt.store import open_store
    from agentbolt.types import RolloutMode

    async def share() -> float | None:
        store = open_store(store_url)
        try:
            found, cursor = [], None
            while True:
                page = await store.query_rollouts(mode=RolloutMode.TRAIN, limit=1000, cursor=cursor)
                found += [r for r in page.items if r.created_at >= since]
                cursor = page.next_cursor
                if not cursor:
                    break
            if not found:
                return None
            spans = await store.query_spans([r.rollout_id for r in found], latest_attempt_only=True)
            s = summarize(found, spans)
            return s.calls_with_exact_ids / s.llm_calls if s.llm_calls else None
        finally:
            await store.close()

    return {**per_rollout(history), "exact_token_id_share": asyncio.run(share())}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    origin = provenance([sys.argv[0], *(sys.argv[1:] if argv is None else argv)], device=args.device)
    try:
        folder = Path(args.data) if args.data else ensure_bundled()
        train = load_split(folder, "train")
        sets = {name: tasks[: args.val or None] for name, tasks in heldout_sets(folder).items()}
    except SpiderDataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    val = [task for tasks in sets.values() for task in tasks]
    agent_match = AGENT_SETS.get(args.train_agents, args.train_agents)
    counts = ", ".join(f"{name} {len(tasks)}" for name, tasks in sets.items())
    print(f"data: {folder} ({len(train)} train; held-out: {counts}); training nodes: {agent_match or 'all'}")
    rank = args.lora_rank or (DEFAULT_RANK if args.policies == "per-role" else None)
    lr = args.lr if args.lr is not None else (1e-5 if rank is None else 1e-4)
    policies = policies_for(args.policies, rank=rank or DEFAULT_RANK)
    print(
        f"policies: {args.policies} "
        + ("(full fine-tune)" if rank is None else f"(LoRA rank {rank})")
        + (f": {', '.join(policies)}" if policies else "")
        + f"; lr {lr:g}"
    )
    algorithm = TorchGRPO(
        args.model,
        steps=args.steps,
        batch_size=args.batch_size,
        group_size=args.group_size,
        sampling={"temperature": args.temperature, "max_tokens": args.max_tokens},
        evaluation={"every": args.val_every or None},
        policy={
            "lora": None if rank is None or policies is not None else {"r": rank, "alpha": 2 * rank},
            "autocast": None if args.autocast == "none" else args.autocast,
            "device": args.device,
        },
        output={"out_dir": args.out, "checkpoint_every": args.steps or None},
        lightningrl=LightningRLConfig(agent_match=agent_match),
        update={"lr": lr, "seed": args.seed},
        seed=args.seed,
    )
    trainer = Trainer(
        sql_agent,
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
        policies=policies,
        # per-role: the gateway routes each call to its role's adapter, so it names the call when
        # it is made (roles.sql_role, from the prompt); shared: nothing to route
        capture=CaptureOptions(agent_names=sql_role) if policies is not None else None,
    )
    started = time.time()
    result = trainer.fit(train, val, max_staleness=args.max_staleness)
    wall_s = time.time() - started
    last = f"val{args.steps}" if args.steps else "val0"
    outcomes = asyncio.run(read_heldout(args.store, ["val0", last], spans=False))
    heldout, failed = {}, {}
    for name in sets:
        before = [o for o in outcomes["val0"] if o.task_id.startswith(f"{name}-")]
        after = [o for o in outcomes[last] if o.task_id.startswith(f"{name}-")]
        heldout[name] = set_score(METRIC, [o.score() for o in before], [o.score() for o in after])
        failed[name] = [sum(not o.succeeded for o in before), sum(not o.succeeded for o in after)]
    capture = capture_figures(args.store, started, result.history)
    record = RunRecord(
        example="sql_agent",
        **origin,
        model=model_name(args.model),
        steps=result.steps,
        wall_s=round(wall_s, 1),
        s_per_step=round(result.seconds_per_step, 1),
        heldout=heldout,
        headline=f"{'unseen_dbs' if 'unseen_dbs' in heldout else next(iter(heldout))}/{METRIC}",
        extra={
            "trained_agents": agent_match or "all",
            "policies": args.policies,
            "policy_names": list(policies) if policies else ["policy"],
            "lora_rank": rank,
            "lr": lr,
            "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, 2),
            "failed_heldout_rollouts_before_after": failed,
            "train_reward": [round(h["train/reward"], 3) for h in result.history if "train/reward" in h],
            **{k: v for k, v in capture.items() if v is not None},
        },
    )
    record.write(Path(args.out) / "result.json")

    for name, score in heldout.items():
        print(
            f"held-out execution accuracy, {name}: {score.before:.3f} +- {score.before_se:.3f} -> "
            f"{score.after:.3f} +- {score.after_se:.3f} (n={score.n}, gain {score.gain_in_se:+.1f} se)".replace(
                "gain +nan se", "no gain"
            ),
            flush=True,
        )
    print(
        f"over {result.steps} steps ({result.seconds_per_step:.1f} s/step, {wall_s / 60:.1f} min in all; "
        f"peak RSS of the trainer {record.extra['peak_rss_gb']:.2f} GB); "
        f"record: {Path(args.out) / 'result.json'}; curve: {result.curve_png}",
        flush=True,
    )

    def fmt(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.3f}"

    print(
        f"capture: {fmt(capture['calls_per_rollout'])} LLM calls and {fmt(capture['transitions_per_rollout'])} "
        f"transitions per training rollout; share of calls with exact token ids {fmt(capture['exact_token_id_share'])}",
        flush=True,
    )
    means = step_means(result.history)
    if means:
        print(
            f"per step (means): rollouts {means.get('time/rollouts_s', 0):.1f} s, update "
            f"{means.get('time/update_s', 0):.1f} s"
            + (
                f"; prompts of {means['update/prompt_len_mean']:.0f} tokens"
                if "update/prompt_len_mean" in means
                else ""
            ),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
