"""Does the whole agentbolt pipeline learn as well and as fast as a bare GRPO loop? (CPU, SmolLM2)

Run (about an hour on a 2-core machine; not part of CI):

    MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736 MALLOC_TOP_PAD_=1073741824 \\
      uv run python benchmarks/cpu_learning.py [--steps 30] [--val 96] [--only bare|agentbolt] [--report]

Both runs train SmolLM2-135M-Instruct on the quickstart's arithmetic questions
(``examples/quickstart/math_tasks.py``) with the same settings: the same batches of 8 questions
x 4 samples per step (same seed), 40 new tokens at T=1.0, AdamW lr 1e-5, grad-clip 1.0, one
update per step, no KL, the same precision (``default_autocast_dtype``: bf16 only where the CPU
runs it fast). Held-out accuracy is one sample per question of 96 fixed questions at T=1.0,
before and after training.

- **bare**: a hand-written loop in one process: ``transformers.generate`` on the prompts, the
  reward, verl's ``compute_grpo_outcome_advantage`` and ``compute_policy_loss_vanilla``
  (token-mean), one backward pass over the whole batch. Nothing of agentbolt but the task file.
- **agentbolt**: ``Trainer`` + ``torch-grpo``: SQLite store, gateway, one runner process
  running the quickstart agent on the OpenAI client, the policy server, spans, LightningRL,
  the updater (rollout-mean-token-mean loss, micro-batches of 2,048 tokens), on its defaults: the
  engine's prompt cache and the updater's ``share_prompts`` run each group's shared prompt once
  (the bare loop runs every sequence whole, as hand-written loops usually do).

Each run is its own subprocess (separate memory and timing). Prints accuracy before/after,
seconds per training step (evaluation excluded) and the ratio agentbolt/bare (target <= 1.15),
and writes both curves to ``--out``.

The agentbolt arm runs the quickstart's update settings (``examples/quickstart/train.py``'s
defaults: gradient checkpointing on), so its step time is the quickstart's.

**Timing mode** (minutes, not an hour; no held-out evaluation): the two arms' step times side
by side, the arms alternating ``--rounds`` times in one invocation, so that load from other
work on a shared machine falls on both; the ratio, not the seconds, is the figure::

    uv run python benchmarks/cpu_learning.py --timing [--steps 3] [--rounds 2] [--record docs/runs/cpu_learning_timing.json]

Each arm's first step is left out of its means (warm-up: first allocations, the engine's first
batches); the record keeps every step's seconds, the arms' order, and the machine's load
before and after each arm.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples" / "quickstart"))

from math_tasks import few_shot, make_tasks, reward  # noqa: E402

from agentbolt.options import RunnerOptions  # noqa: E402

BATCH, GROUP, MAX_NEW, LR, SEED = 8, 4, 40, 1e-5, 0


def train_tasks() -> list[dict[str, Any]]:
    return make_tasks(4000, seed=1, prefix="train-", heldout=False)


def val_tasks(n: int) -> list[dict[str, Any]]:
    return make_tasks(n, seed=2, prefix="val-", heldout=True)


def cpu_pressure() -> str:
    try:
        with open("/proc/pressure/cpu") as f:
            return f.readline().split()[1]  # avg10=...
    except (OSError, IndexError):
        return "n/a"


# -- bare loop ------------------------------------------------------------------------------------


def run_bare(steps: int, n_val: int, out: Path) -> dict[str, Any]:
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from verl.trainer.ppo import core_algos
    from verl.workers.config.actor import ActorConfig

    from agentbolt.algorithm import as_tasks, batches
    from agentbolt_torch.models import smollm2_dir
    from agentbolt_torch.policy import default_autocast_dtype

    torch.manual_seed(SEED)
    path = smollm2_dir()
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    eos = model.config.eos_token_id
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    dtype = default_autocast_dtype("cpu")
    autocast = torch.autocast("cpu", dtype=dtype, enabled=dtype is not None)
    loss_config = ActorConfig(strategy="fsdp", ppo_micro_batch_size_per_gpu=1, rollout_n=GROUP)

    def prompts(questions: list[str]) -> Any:
        texts = [
            tok.apply_chat_template(
                [*few_shot(False), {"role": "user", "content": q}], tokenize=False, add_generation_prompt=True
            )
            for q in questions
        ]
        return tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)

    def sample(questions: list[str]) -> tuple[Any, Any, Any, list[str]]:
        enc = prompts(questions)
        model.eval()
        with torch.no_grad(), autocast:
            out_ids = model.generate(
                **enc, max_new_tokens=MAX_NEW, do_sample=True, temperature=1.0, top_p=1.0, top_k=0, pad_token_id=eos
            )
        resp = out_ids[:, enc.input_ids.shape[1] :]
        is_eos = resp == eos
        last = torch.where(is_eos.any(1), is_eos.float().argmax(1), torch.full((len(resp),), resp.shape[1] - 1))
        mask = (torch.arange(resp.shape[1])[None, :] <= last[:, None]).float()
        texts = [tok.decode(r[: int(n) + 1], skip_special_tokens=True) for r, n in zip(resp, last, strict=True)]
        return enc, resp, mask, texts

    def evaluate() -> float:
        if n_val == 0:
            return float("nan")
        val = val_tasks(n_val)
        correct = 0
        for i in range(0, len(val), 32):
            chunk = val[i : i + 32]
            texts = sample([v["question"] for v in chunk])[3]
            correct += sum(reward(text, v["answer"]) == 1.0 for text, v in zip(texts, chunk, strict=True))
        return correct / len(val)

    before = evaluate()
    history, times = [], []
    for step, batch in enumerate(batches(as_tasks(train_tasks()), BATCH, seed=SEED), start=1):
        if step > steps:
            break
        t0 = time.perf_counter()
        items = [task.input for task in batch for _ in range(GROUP)]
        enc, resp, mask, texts = sample([it["question"] for it in items])
        scores = torch.tensor([reward(text, it["answer"]) for text, it in zip(texts, items, strict=True)])
        last = mask.sum(1).long() - 1
        token_rewards = torch.zeros_like(mask)
        token_rewards[torch.arange(len(scores)), last] = scores
        index = np.array([i // GROUP for i in range(len(scores))], dtype=object)
        adv, _ = core_algos.compute_grpo_outcome_advantage(
            token_level_rewards=token_rewards, response_mask=mask, index=index
        )
        model.train()
        ids = torch.cat([enc.input_ids, resp], 1)
        attn = torch.cat([enc.attention_mask, mask.long()], 1)
        positions = (attn.cumsum(-1) - 1).clamp(min=0)
        with autocast:
            logits = model(input_ids=ids, attention_mask=attn, position_ids=positions).logits
        logits = logits[:, enc.input_ids.shape[1] - 1 : -1].float()
        logp = torch.log_softmax(logits, -1).gather(-1, resp.unsqueeze(-1)).squeeze(-1)
        loss, _ = core_algos.compute_policy_loss_vanilla(
            old_log_prob=logp.detach(),
            log_prob=logp,
            advantages=adv,
            response_mask=mask,
            loss_agg_mode="token-mean",
            config=loss_config,
        )
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        elapsed = time.perf_counter() - t0
        times.append(elapsed)
        history.append({"step": step, "train/reward": scores.mean().item()})
        print(
            f"bare step {step}/{steps}: reward {scores.mean():.3f} {elapsed:.1f} s (cpu {cpu_pressure()})", flush=True
        )
    after = evaluate()
    history.append({"step": steps, "val/accuracy": after})
    history.insert(0, {"step": 0, "val/accuracy": before})
    return {"accuracy_before": before, "accuracy_after": after, "step_times": times, "history": history}


# -- agentbolt pipeline ---------------------------------------------------------------------------


def run_agentbolt(steps: int, n_val: int, out: Path) -> dict[str, Any]:
    from agent import math_agent_no_tool

    from agentbolt.trainer import Trainer
    from agentbolt_torch.training.algorithm import TorchGRPO

    db = out / "agentbolt.db"
    for suffix in ("", "-wal", "-shm", "-agentbolt-lock"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    algorithm = TorchGRPO(
        "smollm2",
        steps=steps,
        batch_size=BATCH,
        group_size=GROUP,
        sampling={"temperature": 1.0, "max_tokens": MAX_NEW},
        evaluation={"every": None},
        output={"out_dir": out / "agentbolt", "plot": False},
        update={"lr": LR, "seed": SEED, "gradient_checkpointing": True},  # the quickstart's default
        seed=SEED,
    )
    trainer = Trainer(
        math_agent_no_tool,
        algorithm,
        store=f"sqlite:///{db}",
        runners=RunnerOptions(n=1, concurrency=BATCH * GROUP),
        progress=False,
    )
    result = trainer.fit(train_tasks(), val_tasks(n_val))
    times = [h["time/step_s"] for h in result.history if "time/step_s" in h]
    return {
        "accuracy_before": result.accuracy_before,
        "accuracy_after": result.accuracy_after,
        "step_times": times,
        "history": result.history,
    }


# -- driver ---------------------------------------------------------------------------------------


def describe(results: dict[str, dict[str, Any]]) -> str:
    """The settings the arms' JSON files say they ran with: ``30 steps x 8x4 samples, 96 held-out questions``.

    Arms that ran with different settings are each named; a file written before the settings
    were recorded says so instead of guessing.
    """
    found = {name: r.get("settings") for name, r in results.items()}
    if any(s is None for s in found.values()):
        missing = ", ".join(name for name, s in found.items() if s is None)
        return f"settings not recorded in the JSON of {missing} (written by an older version of this script)"

    def text(s: dict[str, int]) -> str:
        return f"{s['steps']} steps x {s['batch']}x{s['group']} samples, {s['val']} held-out questions"

    texts = {name: text(s) for name, s in found.items()}
    if len(set(texts.values())) == 1:
        return next(iter(texts.values()))
    return "; ".join(f"{name}: {t}" for name, t in texts.items())


def loadavg() -> float:
    """The machine's 1-minute load average (what else ran beside an arm)."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return float("nan")


def timing(args: argparse.Namespace) -> int:
    """The timing mode (module doc): the arms alternate ``--rounds`` times; prints and records the ratio."""
    from agentbolt.runs.evaluation import provenance

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    runs: list[dict[str, Any]] = []
    for round_ in range(1, args.rounds + 1):
        for name in ("bare", "agentbolt"):
            out = args.out / f"timing-{round_}"
            out.mkdir(parents=True, exist_ok=True)
            print(f"== round {round_}/{args.rounds}: {name} ({args.steps} steps, no evaluation)", flush=True)
            load_before = loadavg()
            cmd = [sys.executable, __file__, "--only", name, "--steps", str(args.steps), "--val", "0"]
            subprocess.run([*cmd, "--out", str(out)], check=True, env=env)
            result = json.loads((out / f"{name}.json").read_text())
            row: dict[str, Any] = {
                "arm": name,
                "round": round_,
                "step_s": [round(t, 2) for t in result["step_times"]],
                "load_before": load_before,
                "load_after": loadavg(),
            }
            if name == "agentbolt":
                steps = [h for h in result["history"] if "time/step_s" in h]
                row["rollouts_s"] = [round(h["time/rollouts_s"], 2) for h in steps]
                row["update_s"] = [round(h["time/update_s"], 2) for h in steps]
            runs.append(row)

    def warm(name: str, key: str = "step_s") -> list[float]:
        return [t for r in runs if r["arm"] == name for t in r[key][1:]]

    arms = {}
    for name in ("bare", "agentbolt"):
        times = warm(name)
        arms[name] = {
            "steps_timed": len(times),
            "mean_s": statistics.fmean(times),
            "median_s": statistics.median(times),
        }
    arms["agentbolt"]["rollouts_mean_s"] = statistics.fmean(warm("agentbolt", "rollouts_s"))
    arms["agentbolt"]["update_mean_s"] = statistics.fmean(warm("agentbolt", "update_s"))
    rounded = {name: {k: round(v, 2) if isinstance(v, float) else v for k, v in a.items()} for name, a in arms.items()}
    record = {
        **provenance([__file__, *sys.argv[1:]]),
        "settings": {"steps": args.steps, "rounds": args.rounds, "batch": BATCH, "group": GROUP, "max_new": MAX_NEW},
        "arms": rounded,
        "ratio_mean": round(arms["agentbolt"]["mean_s"] / arms["bare"]["mean_s"], 3),
        "ratio_median": round(arms["agentbolt"]["median_s"] / arms["bare"]["median_s"], 3),
        "runs": runs,
    }
    print(
        f"\nbare {arms['bare']['mean_s']:.1f} s/step (median {arms['bare']['median_s']:.1f}), agentbolt "
        f"{arms['agentbolt']['mean_s']:.1f} s/step (median {arms['agentbolt']['median_s']:.1f}; rollouts "
        f"{arms['agentbolt']['rollouts_mean_s']:.1f} + update {arms['agentbolt']['update_mean_s']:.1f}), first step of "
        f"each arm left out; agentbolt / bare: {record['ratio_mean']:.2f}x mean, {record['ratio_median']:.2f}x median "
        "(goal <= 0.5x)",
        flush=True,
    )
    if args.record:
        args.record.parent.mkdir(parents=True, exist_ok=True)
        args.record.write_text(json.dumps(record, indent=1) + "\n")
        print(f"record: {args.record}")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=None, help="training steps per arm (default 30; --timing: 3)")
    p.add_argument("--val", type=int, default=96)
    p.add_argument("--only", choices=["bare", "agentbolt"])
    p.add_argument("--out", type=Path, default=REPO / "runs" / "bench-cpu-learning")
    p.add_argument("--report", action="store_true", help="only print the table from the arms' JSON files in --out")
    p.add_argument("--timing", action="store_true", help="time a few steps per arm, arms alternating (module doc)")
    p.add_argument("--rounds", type=int, default=2, help="--timing: how many times the two arms alternate")
    p.add_argument("--record", type=Path, help="--timing: write the figures here as JSON")
    args = p.parse_args()
    if args.steps is None:
        args.steps = 3 if args.timing else 30
    if args.steps < (2 if args.timing else 1) or args.rounds < 1:
        p.error("--steps must be at least 2 with --timing (the first is warm-up), --rounds at least 1")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.timing:
        return timing(args)
    if args.only:
        run = run_bare if args.only == "bare" else run_agentbolt
        result = run(args.steps, args.val, args.out)
        # what the arm ran with, so --report describes the run it reads (not today's command line)
        result["settings"] = {"steps": args.steps, "val": args.val, "batch": BATCH, "group": GROUP}
        (args.out / f"{args.only}.json").write_text(json.dumps(result, indent=1))
        return 0

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    results = {}
    for name in ("bare", "agentbolt"):
        if not args.report:
            print(f"== {name} ({args.steps} steps)", flush=True)
            cmd = [sys.executable, __file__, "--only", name, "--steps", str(args.steps), "--val", str(args.val)]
            subprocess.run([*cmd, "--out", str(args.out)], check=True, env=env)
        path = args.out / f"{name}.json"
        if not path.exists():
            print(f"no {path}: run `benchmarks/cpu_learning.py --only {name}` first", file=sys.stderr)
            return 1
        results[name] = json.loads(path.read_text())

    from agentbolt_torch.training.metrics import plot_curves, step_means

    print(f"\nSmolLM2-135M, {describe(results)} at T=1.0")
    print(
        f"{'pipeline':<10} {'acc before':>10} {'acc after':>10} {'gain':>7} {'s/step mean':>12} {'s/step median':>14}"
    )
    for name, r in results.items():
        times = r["step_times"]
        print(
            f"{name:<10} {r['accuracy_before']:>10.3f} {r['accuracy_after']:>10.3f} "
            f"{r['accuracy_after'] - r['accuracy_before']:>+7.3f} {statistics.fmean(times):>12.1f} "
            f"{statistics.median(times):>14.1f}"
        )
        plot_curves(r["history"], args.out / f"{name}-curve.png", title=f"{name}: SmolLM2 arithmetic GRPO")
    means = step_means(results["agentbolt"]["history"])
    if means:
        print(
            f"agentbolt per step: rollouts {means['time/rollouts_s']:.1f} s (engine forward passes "
            f"{means.get('engine/busy_s', 0):.1f} s) + update {means['time/update_s']:.1f} s; "
            f"{means.get('engine/prompt_tokens', 0):,.0f} prompt tokens computed, "
            f"{means.get('engine/cached_prompt_tokens', 0):,.0f} from the prompt cache; "
            f"prompts {means.get('update/prompt_len_mean', 0):.0f} + responses "
            f"{means.get('update/response_len_mean', 0):.0f} tokens"
        )
    a, b = results["agentbolt"]["step_times"], results["bare"]["step_times"]
    ratio, ratio_median = statistics.fmean(a) / statistics.fmean(b), statistics.median(a) / statistics.median(b)
    print(
        f"agentbolt / bare time per step: {ratio:.2f}x mean, {ratio_median:.2f}x median (target <= 1.15x); "
        f"curves in {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
