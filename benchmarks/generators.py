"""agentbolt's own generator against vLLM on the same workload (docs/generators.md).

Run:  ./dev setup --vllm   # vLLM's environment, .venv-vllm (once)
      AGENTBOLT_VLLM_PYTHON=$PWD/.venv-vllm/bin/python uv run python benchmarks/generators.py \\
          [--model smollm2] [--requests 16] [--n 4] [--max-tokens 64] [--rounds 3] \\
          [--record docs/runs/generators.json]
      uv run python benchmarks/generators.py --report docs/runs/generators.json   # print a record again

Each generator is served by a child process exactly as a training run serves it: ``own`` is
:class:`~agentbolt_torch.serving.local.LocalGenerator` (engine + policy server in one process),
``vllm`` is :class:`~agentbolt_torch.serving.vllm.VLLMGenerator` (the policy in the child, the vLLM
server in its own processes). Measured per arm: start-up (process launch to the endpoint answering,
model load included), then ``--rounds`` rounds **alternating the arms** (own, vllm, own, vllm, ...)
of ``--requests`` concurrent chat calls, ``n`` samples each, ``--max-tokens`` tokens each (eos
ignored), temperature 1: generated tokens per second over the round, p50 / p99 call latency; and
the peak memory of each arm's whole process tree (RSS summed over the processes, sampled every
0.5 s while it runs). The prompts share a few-shot system prompt and differ in the question, as a
training batch does (vLLM's prefix cache and agentbolt's prompt cache both apply to the shared part).

On a shared machine only the ratios of arms measured in the same run mean something: the record
keeps the load average and CPU pressure before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ARMS = ("own", "vllm")
SYSTEM = (
    "You are a helpful assistant. Solve the arithmetic question, show the calculation in one line "
    "and give the final answer as a number inside <answer>...</answer>."
)
SHOTS = [
    ("What is 3 + 5?", "3 + 5 = 8. <answer>8</answer>"),
    ("What is 20 - 4?", "20 - 4 = 16. <answer>16</answer>"),
    ("What is 7 + 12?", "7 + 12 = 19. <answer>19</answer>"),
]


def messages(i: int) -> list[dict[str, str]]:
    out = [{"role": "system", "content": SYSTEM}]
    for question, answer in SHOTS:
        out += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    return [*out, {"role": "user", "content": f"What is {11 + i} + {3 * i + 2}?"}]


# -- the child: one generator, served until stdin closes ---------------------------------------------


def serve(arm: str, model: str, seed: int) -> None:
    """Serve ``model`` with ``arm``'s generator; print the base URL and model name; stop at EOF."""
    import logging

    from agentbolt_torch.policy import Policy

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    policy = Policy.load(model, seed=seed)
    generator: Any
    if arm == "own":
        from agentbolt_torch.serving.local import LocalGenerator

        generator = LocalGenerator(policy, seed=seed, max_batch_size=128)
    else:
        from agentbolt_torch.serving.vllm import VLLMGenerator

        generator = VLLMGenerator(policy, seed=seed)
    generator.start()
    print(json.dumps({"base_url": generator.base_url, "model": generator.served_model_name}), flush=True)
    sys.stdin.read()
    generator.stop()


# -- the parent ------------------------------------------------------------------------------------


class Arm:
    """One generator in a child process, with its process tree's peak memory."""

    def __init__(self, name: str, model: str, seed: int) -> None:
        self.name = name
        started = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", name, "--model", model, "--seed", str(seed)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.peak_rss = 0
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the {name} generator did not start (exit code {self.proc.wait()})")
        ready = json.loads(line)
        self.startup_s = time.monotonic() - started
        self.base_url, self.model = ready["base_url"], ready["model"]

    def _sample(self) -> None:
        import psutil

        root = psutil.Process(self.proc.pid)
        while not self._stop.is_set():
            try:
                total = sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])
            except psutil.Error:
                total = 0
            self.peak_rss = max(self.peak_rss, total)
            time.sleep(0.5)

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(120)
        self._stop.set()


async def one_round(arm: Arm, requests: int, n: int, max_tokens: int) -> dict[str, float]:
    import httpx

    async def call(client: httpx.AsyncClient, i: int) -> tuple[float, int]:
        started = time.monotonic()
        body = {
            "model": arm.model,
            "messages": messages(i),
            "n": n,
            "max_tokens": max_tokens,
            "temperature": 1.0,
            "ignore_eos": True,
            "logprobs": True,
            "return_token_ids": True,
        }
        r = await client.post(f"{arm.base_url}/chat/completions", json=body)
        r.raise_for_status()
        data = r.json()
        assert all(len(c["token_ids"]) == len(c["logprobs"]["content"]) for c in data["choices"])
        return time.monotonic() - started, sum(len(c["token_ids"]) for c in data["choices"])

    async with httpx.AsyncClient(timeout=1800) as client:
        started = time.monotonic()
        results = await asyncio.gather(*(call(client, i) for i in range(requests)))
        wall = time.monotonic() - started
    latencies = sorted(r[0] for r in results)
    tokens = sum(r[1] for r in results)
    return {
        "tokens": tokens,
        "wall_s": round(wall, 2),
        "tokens_per_s": round(tokens / wall, 1),
        "p50_s": round(statistics.median(latencies), 2),
        "p99_s": round(latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 2),
    }


def machine() -> dict[str, Any]:
    try:
        pressure = Path("/proc/pressure/cpu").read_text().splitlines()[0]
    except OSError:
        pressure = "n/a"
    return {"loadavg": [round(x, 2) for x in os.getloadavg()], "cpu_pressure": pressure, "cpus": os.cpu_count()}


def report(record: dict[str, Any]) -> None:
    w = record["workload"]
    print(f"{record['model']}: {w['requests']} concurrent chat calls x n={w['n']} x {w['max_tokens']} tokens")
    print(f"machine before: {record['machine_before']}  after: {record['machine_after']}")
    for arm in ARMS:
        a = record["arms"][arm]
        print(f"{arm:5s} start-up {a['startup_s']:.1f} s, peak RSS of its processes {a['peak_rss_gb']:.2f} GB")
    print("round  arm    tokens/s   p50 s   p99 s")
    for r in record["rounds"]:
        print(f"{r['round']:5d}  {r['arm']:5s} {r['tokens_per_s']:9.1f} {r['p50_s']:7.2f} {r['p99_s']:7.2f}")
    print("vllm / own tokens/s per round pair:", record["ratios"]["tokens_per_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--record", type=Path, help="write the figures here as JSON")
    parser.add_argument("--report", type=Path, help="print the figures of a record (run nothing)")
    parser.add_argument("--serve", choices=ARMS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.model, args.seed)
        return
    if args.report:
        report(json.loads(args.report.read_text()))
        return
    before = machine()
    arms = {name: Arm(name, args.model, args.seed) for name in ARMS}  # both up: rounds alternate
    rounds = []
    try:
        for arm in arms.values():  # warm-up, not recorded: first-call compilation and allocation
            asyncio.run(one_round(arm, 2, 1, 8))
        for i in range(args.rounds):
            for name in ARMS:
                result = asyncio.run(one_round(arms[name], args.requests, args.n, args.max_tokens))
                rounds.append({"round": i, "arm": name, **result})
                print(f"round {i} {name}: {result}", flush=True)
    finally:
        for arm in arms.values():
            arm.close()
    by_round = {(r["round"], r["arm"]): r for r in rounds}
    record = {
        "model": args.model,
        "workload": {"requests": args.requests, "n": args.n, "max_tokens": args.max_tokens, "temperature": 1.0},
        "machine_before": before,
        "machine_after": machine(),
        "arms": {
            name: {"startup_s": round(arm.startup_s, 1), "peak_rss_gb": round(arm.peak_rss / 1e9, 2)}
            for name, arm in arms.items()
        },
        "rounds": rounds,
        "ratios": {
            "tokens_per_s": [
                round(by_round[(i, "vllm")]["tokens_per_s"] / by_round[(i, "own")]["tokens_per_s"], 2)
                for i in range(args.rounds)
            ]
        },
    }
    report(record)
    if args.record:
        args.record.parent.mkdir(parents=True, exist_ok=True)
        args.record.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
