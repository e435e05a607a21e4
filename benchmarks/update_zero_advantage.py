"""The quickstart's policy update with and without skipping zero-gradient rows, side by side.

Run:  ./dev bench update_zero_advantage [--rounds 2] [--zero-groups 5] [--record docs/runs/update_zero_advantage.json]

SmolLM2-135M-Instruct, one update per arm per round on a quickstart-shaped batch: 8 GRPO groups
of 4 samples, each group's prompt the quickstart's few-shot chat (about 117 tokens), responses of
12-40 random tokens; ``--zero-groups`` of the groups score alike (advantage exactly 0: in the
quickstart's published run about 5 of 8 groups per step did). Both arms use the quickstart's
update settings (bf16 autocast where fast, gradient checkpointing, 2,048-token micro-batches),
and differ only in ``UpdateConfig.skip_zero_advantage``; they update one model (an optimizer
each: the weights' values do not change the time) with the same batch, and alternate, so load
from other work falls on both. The first round
is warm-up (reported, left out of the means). Prints seconds per update and the ratio; with
``--record``, writes them as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples" / "quickstart"))

from math_tasks import few_shot, make_tasks  # noqa: E402

GROUPS, GROUP = 8, 4


def batch(tokenizer: Any, zero_groups: int, seed: int = 0) -> list[Any]:
    """The quickstart-shaped transitions (module doc); the first ``zero_groups`` groups have advantage 0."""
    from agentbolt.types import Transition

    rng = random.Random(seed)
    tasks = make_tasks(GROUPS, seed=1, prefix="t-", heldout=False)
    rows = []
    for g, task in enumerate(tasks):
        messages = [*few_shot(False), {"role": "user", "content": task["question"]}]
        prompt = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
        for k in range(GROUP):
            n = rng.randint(12, 40)
            rows.append(
                Transition(
                    rollout_id=f"g{g}-{k}",
                    group_id=f"g{g}",
                    index=0,
                    prompt_ids=prompt,
                    response_ids=[rng.randrange(100, 40_000) for _ in range(n)],
                    response_logprobs=[-2.0] * n,
                    advantage=0.0 if g < zero_groups else rng.uniform(-1.0, 1.0),
                )
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=2, help="updates per arm, the arms alternating (first: warm-up)")
    p.add_argument("--zero-groups", type=int, default=5, help="groups (of 8) whose advantages are 0 (default 5)")
    p.add_argument("--record", type=Path, help="write the figures here as JSON")
    args = p.parse_args(argv)
    if args.rounds < 2 or not 0 <= args.zero_groups <= GROUPS:
        p.error(f"--rounds must be at least 2 (the first is warm-up), --zero-groups 0..{GROUPS}")

    from agentbolt.runs.evaluation import provenance
    from agentbolt_torch.policy import Policy
    from agentbolt_torch.update.updater import PolicyUpdater, UpdateConfig

    policy = Policy.load("smollm2")
    rows = batch(policy.tokenizer, args.zero_groups)
    arms = {
        name: PolicyUpdater(policy, UpdateConfig(lr=1e-5, gradient_checkpointing=True, skip_zero_advantage=skip))
        for name, skip in (("all_rows", False), ("skip_zero_advantage", True))
    }
    seconds: dict[str, list[float]] = {name: [] for name in arms}
    loads: list[float] = []
    for round_ in range(args.rounds):
        for name, updater in arms.items():
            metrics = updater.update(rows)
            seconds[name].append(round(metrics.seconds, 2))
            loads.append(round(os.getloadavg()[0], 2))
            print(
                f"round {round_ + 1}/{args.rounds} {name}: {metrics.seconds:.1f} s, {metrics.micro_batches} "
                f"micro-batches, {metrics.zero_advantage_skipped} rows skipped (load {loads[-1]})",
                flush=True,
            )
    means = {name: statistics.fmean(s[1:]) for name, s in seconds.items()}
    ratio = means["skip_zero_advantage"] / means["all_rows"]
    print(
        f"update (warm-up round left out): all rows {means['all_rows']:.1f} s, skipping zero-advantage rows "
        f"{means['skip_zero_advantage']:.1f} s: {ratio:.2f}x"
    )
    if args.record:
        record = {
            **provenance([__file__, *(sys.argv[1:] if argv is None else argv)]),
            "settings": {"groups": GROUPS, "group": GROUP, "zero_groups": args.zero_groups, "rounds": args.rounds},
            "seconds": seconds,
            "mean_s": {name: round(m, 2) for name, m in means.items()},
            "ratio": round(ratio, 3),
            "loadavg": loads,
        }
        args.record.parent.mkdir(parents=True, exist_ok=True)
        args.record.write_text(json.dumps(record, indent=1) + "\n")
        print(f"record: {args.record}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
