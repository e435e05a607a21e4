"""Improve a deployed agent from its production traces: OTLP traces -> scored rollouts -> SFT on the best.

    uv run python examples/traces_agent/improve.py                    # SmolLM2-135M-Instruct on CPU
    uv run python examples/traces_agent/improve.py --model tiny --traces 8 --val 4 --steps 2 --threshold 0

What runs, in order:

1. **The deployment.** The base model is served by agentbolt-torch's policy server, used here as a
   plain OpenAI-compatible model server (agentbolt's gateway is not involved: the agent calls the
   server directly). The deployed agent (``deployed_agent.py``, a plain ``openai`` client with
   OpenInference's instrumentation and the standard OTLP/HTTP exporter, in its own process)
   answers ``--traces`` production questions at T = 1.0 and exports one trace per question.
2. **Ingestion.** ``agentbolt.traces`` receives the OTLP traces (what ``agentbolt ingest`` runs),
   turns each trace into a rollout of the run ``--run``, rebuilds the calls' token ids with the
   policy's tokenizer (drift-checked), and scores each finished trace with :func:`score` -- the
   team's own scoring function, here the known answer of the question.
3. **SFT on the best traces.** The calls of the traces whose reward reaches ``--threshold``
   become demonstrations (``demonstrations_from_spans``); ``torch-sft`` trains the base model on
   them, rendered with the policy's own chat template. The best traces are also written as chat
   JSONL and ATIF (``agentbolt export`` does the same from the command line).
4. **Held-out before/after.** ``torch-sft`` measures accuracy on ``--val`` held-out questions
   (problems no production question asks, ``math_tasks.is_heldout``) with the same agent through
   agentbolt's gateway, before and after, next to the trivial policies' scores on the same
   questions. The record goes to ``--out``/result.json (``docs/runs/traces_agent/`` holds the
   published one).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
QUICKSTART = HERE.parent / "quickstart"
sys.path.insert(0, str(QUICKSTART))  # the quickstart's tasks, agent and trivial policies

from agent import math_agent_no_tool  # noqa: E402
from baselines import rule_scores, trivial_scores  # noqa: E402
from math_tasks import make_tasks, reward  # noqa: E402

from agentbolt.options import RunnerOptions  # noqa: E402
from agentbolt.runs.evaluation import provenance  # noqa: E402
from agentbolt.store import RolloutSearch, open_store  # noqa: E402
from agentbolt.trainer import Trainer  # noqa: E402

log = logging.getLogger("traces_agent")

DEPLOYED_AGENT = HERE / "deployed_agent.py"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2", help="smollm2 (bundled), tiny (random, for smoke runs) or a HF dir")
    p.add_argument("--traces", type=int, default=128, help="production questions the deployed agent answers")
    p.add_argument("--concurrency", type=int, default=32, help="questions the deployed agent answers at once")
    p.add_argument("--val", type=int, default=96, help="held-out questions (default 96)")
    p.add_argument("--threshold", type=float, default=1.0, help="imitate traces whose reward is at least this")
    p.add_argument("--steps", type=int, default=8, help="SFT steps (default 8)")
    p.add_argument("--batch-size", type=int, default=16, help="traces per SFT step (default 16)")
    p.add_argument("--lr", type=float, default=1e-5, help="learning rate (default 1e-5)")
    p.add_argument("--run", default="prod-traces", help="the run the traces become rollouts of")
    p.add_argument("--out", default="runs/traces_agent", help="store, exports, checkpoint and record directory")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def production_questions(n: int) -> list[dict[str, Any]]:
    """What users asked the deployed agent (never a held-out problem)."""
    return make_tasks(n, seed=1, prefix="prod-", heldout=False)


def heldout_questions(n: int) -> list[dict[str, Any]]:
    """The held-out questions: problems production never asks (``math_tasks.is_heldout``)."""
    return make_tasks(n, seed=2, prefix="val-", heldout=True)


def make_scorer(questions: list[dict[str, Any]]) -> Any:
    """The team's scoring function over a finished trace: the quickstart's reward of the agent's
    last reply against the known answer of the question it was asked (1.0 right, 0.1 a
    well-formed wrong answer, 0 otherwise); ``None`` (no reward) for a question it does not know."""
    gold = {q["question"]: int(q["answer"]) for q in questions}

    def score(traced: Any) -> float | None:
        messages = traced.trajectory.messages
        asked = [m for m in messages if m.get("role") == "user"]
        question = str(asked[-1].get("content")) if asked else ""
        if question not in gold:
            return None
        replies = [m for m in messages if m.get("role") == "assistant"]
        return reward(str(replies[-1].get("content") or "") if replies else "", gold[question])

    return score


def deploy_and_ingest(args: argparse.Namespace, store_url: str, questions: list[dict[str, Any]]) -> dict[str, Any]:
    """Steps 1 and 2: serve the base model, run the deployed agent against it with its traces
    going to agentbolt's OTLP receiver, and complete every trace. Returns what happened."""
    from agentbolt.traces import IngestOptions, IngestThread, SpanTranslation, TraceIngestor
    from agentbolt_torch.generation.engine import GenerationEngine
    from agentbolt_torch.policy import Policy
    from agentbolt_torch.serving.server import PolicyServer

    policy = Policy.load(args.model, seed=args.seed)
    out = Path(args.out)
    questions_file = out / "production_questions.jsonl"
    questions_file.write_text("".join(json.dumps({"question": q["question"]}) + "\n" for q in questions))
    scorer = make_scorer(questions)
    # built here, not on the ingest thread, whose start has a deadline: on a loaded machine the
    # adapters' and the HTTP server's imports alone can take most of it
    translation = SpanTranslation(policy.tokenizer)
    import uvicorn  # noqa: F401

    from agentbolt.traces import create_ingest_app  # noqa: F401

    with (
        PolicyServer(GenerationEngine(policy, max_batch_size=32, default_max_tokens=40)) as server,
        IngestThread(
            store_url,
            lambda store: TraceIngestor(
                store,
                args.run,
                translation=translation,
                options=IngestOptions(quiet_s=2.0),
                scorer=scorer,
            ),
            grpc_port=None,
        ) as ingest,
    ):
        started = time.monotonic()
        done = subprocess.run(
            [
                sys.executable,
                str(DEPLOYED_AGENT),
                "--base-url",
                server.base_url,
                "--model",
                policy.name,
                "--otlp",
                f"{ingest.http_url}/v1/traces",
                "--questions",
                str(questions_file),
                "--concurrency",
                str(args.concurrency),
            ],
            capture_output=True,
            text=True,
            timeout=6 * 3600,
        )
        if done.returncode != 0:
            raise SystemExit(f"the deployed agent failed:\n{done.stderr[-4000:]}")
        sent = json.loads(done.stdout.strip().splitlines()[-1])
        deploy_s = time.monotonic() - started
        ingest.call(lambda ingestor: ingestor.complete_all(), timeout=600)
        status = ingest.call(lambda ingestor: asyncio.sleep(0, ingestor.status()))
    return {"sent": sent, "status": status, "deploy_s": deploy_s}


async def read_run(store_url: str, run_id: str) -> tuple[list[Any], dict[str, list[Any]]]:
    store = open_store(store_url)
    try:
        rollouts: list[Any] = []
        while True:
            page = await store.search_rollouts(RolloutSearch(run_id=run_id, limit=1000, offset=len(rollouts)))
            rollouts.extend(page.items)
            if not page.items or len(rollouts) >= page.total:
                break
        spans = await store.query_spans([r.rollout_id for r in rollouts], latest_attempt_only=True)
        return rollouts, {k: list(v) for k, v in spans.items()}
    finally:
        await store.close()


def write_exports(out: Path, rollouts: list[Any], spans: dict[str, list[Any]], threshold: float) -> dict[str, int]:
    """The best traces as chat JSONL and ATIF (what ``agentbolt export`` writes)."""
    from agentbolt.runs.atif_export import rollout_trajectory
    from agentbolt.runs.chat_calls import chat_record, rollout_chat_calls, select_rollouts

    best = select_rollouts(rollouts, min_reward=threshold)
    lines, trajectories = [], []
    for r in best:
        calls = rollout_chat_calls(r, spans.get(r.rollout_id, []))
        lines.extend(json.dumps(chat_record(r, c)) for c in calls)
        if calls:
            trajectories.append(json.dumps(rollout_trajectory(r, spans[r.rollout_id], calls=calls).to_json_dict()))
    (out / "best.chat.jsonl").write_text("".join(f"{line}\n" for line in lines))
    (out / "best.atif.jsonl").write_text("".join(f"{line}\n" for line in trajectories))
    return {"chat_calls": len(lines), "atif_trajectories": len(trajectories)}


def se(p: float, n: int) -> float:
    """Standard error of an accuracy ``p`` over ``n`` questions."""
    return math.sqrt(p * (1 - p) / n) if n else float("nan")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    origin = provenance([sys.argv[0], *(sys.argv[1:] if argv is None else argv)])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    store_url = f"sqlite:///{out / 'traces.db'}"
    questions = production_questions(args.traces)
    val = heldout_questions(args.val)
    started = time.time()

    deployed = deploy_and_ingest(args, store_url, questions)
    rollouts, spans = asyncio.run(read_run(store_url, args.run))
    from agentbolt_torch.training.demonstrations import demonstrations_from_spans
    from agentbolt_torch.training.sft import TorchSFT

    demos = demonstrations_from_spans(rollouts, spans, threshold=args.threshold)
    rewarded = [r for r in rollouts if r.final_reward is not None]
    kept = {d.episode for d in demos}
    exports = write_exports(out, rollouts, spans, args.threshold)
    status = deployed["status"]
    print(
        f"deployment: {deployed['sent']['answered']} questions answered, {len(deployed['sent']['traces'])} traces "
        f"exported; ingested {len(rollouts)} rollouts of run {args.run!r} ({sum(s['llm_calls'] for s in status)} LLM "
        f"calls, {sum(s['retokenized'] for s in status)} retokenized, "
        f"{sum(sum(s['excluded'].values()) for s in status)} excluded with a reason (drift check)), {len(rewarded)} scored, "
        f"{sum(r.final_reward == 1.0 for r in rewarded)} right; {len(kept)} traces kept for SFT (reward >= "
        f"{args.threshold:g}), {len(demos)} calls",
        flush=True,
    )

    sft = TorchSFT(
        args.model,
        demonstrations=demos,
        steps=args.steps,
        batch_size=args.batch_size,
        sampling={"temperature": 1.0, "max_tokens": 40},
        update={"lr": args.lr, "seed": args.seed},
        output={"out_dir": out / "sft", "checkpoint_every": None},
        seed=args.seed,
    )
    trivial = trivial_scores(val=val)
    trainer = Trainer(
        math_agent_no_tool,
        sft,
        store=store_url,
        runners=RunnerOptions(n=0, concurrency=32, timeout_s=300.0),
        progress=False,
        run={
            "config": {
                "heldout_metric": {"name": "accuracy", "threshold": 1.0},
                "trivial": {row["policy"]: row["score"] for row in trivial},
                "traces_run": args.run,
            }
        },
    )
    result = trainer.fit([], val)
    wall_s = time.time() - started
    before, after = result.accuracy_before, result.accuracy_after
    assert before is not None and after is not None
    record = {
        "example": "traces_agent",
        **origin,
        "model": args.model,
        "wall_s": wall_s,
        "deploy_s": deployed["deploy_s"],
        "traces": {
            "questions": len(questions),
            "exported": len(deployed["sent"]["traces"]),
            "rollouts": len(rollouts),
            "llm_calls": sum(s["llm_calls"] for s in status),
            "retokenized": sum(s["retokenized"] for s in status),
            "excluded_calls": sum(sum(s["excluded"].values()) for s in status),
            "scored": len(rewarded),
            "right": sum(r.final_reward == 1.0 for r in rewarded),
            "accuracy": sum(r.final_reward == 1.0 for r in rewarded) / len(rollouts) if rollouts else 0.0,
            "kept": len(kept),
            "demonstration_calls": len(demos),
            **exports,
        },
        "sft": {
            "steps": result.steps,
            "batch_size": args.batch_size,
            "lr": args.lr,
            "threshold": args.threshold,
            "seconds_per_step": result.seconds_per_step,
        },
        "heldout": {
            "n": len(val),
            "before": before,
            "after": after,
            "before_se": se(before, len(val)),
            "after_se": se(after, len(val)),
            "gain": after - before,
        },
        "trivial": {row["policy"]: row["score"] for row in trivial},
        "rule": {row["policy"]: row["score"] for row in rule_scores()},
    }
    (out / "result.json").write_text(json.dumps(record, indent=2) + "\n")
    print(
        f"held-out accuracy {before:.3f} ± {se(before, len(val)):.3f} -> {after:.3f} ± {se(after, len(val)):.3f} "
        f"(n={len(val)}) after {result.steps} SFT steps on {len(kept)} production traces; trivial policies: "
        + ", ".join(f"{k} {v:.3f}" for k, v in record["trivial"].items())
        + f"; {wall_s / 60:.1f} min in all; record: {out / 'result.json'}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
