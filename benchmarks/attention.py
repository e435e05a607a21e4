"""Grouped-query attention in generation: transformers' ``sdpa`` (key/value heads copied) against
``agentbolt_sdpa`` (PyTorch's grouped mode, :mod:`agentbolt_torch.attention`), side by side.

Run:  MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736 MALLOC_TOP_PAD_=1073741824 MALLOC_ARENA_MAX=2 \\
      uv run python benchmarks/attention.py [--rows 32] [--prompt-tokens 380] [--new-tokens 40] [--rounds 3]
      [--record docs/runs/attention.json]
      uv run python benchmarks/attention.py --report docs/runs/attention.json   # print a record again

Prints:
- one attention call at SmolLM2's shape (9 query heads on 3 key/value heads, head size 64, bf16),
  a decode step's query against ``--prompt-tokens`` cached positions under a left-padding mask
  for ``--rows`` rows: milliseconds per call for each, and whether the outputs are bit-identical;
- the generation engine on SmolLM2 with the quickstart's load (``--rows`` requests: groups of 4
  samples of ``--rows / 4`` distinct prompts of about ``--prompt-tokens`` tokens, ``--new-tokens``
  each, eos ignored), the two implementations alternating ``--rounds`` times on the same model:
  decode tokens/s, their ratio, and whether the two produced the same tokens and logprobs
  (seeded sampling).
The figures are seconds on a shared machine: compare the two columns of one run only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from agentbolt_torch.attention import ATTENTION_NAME
from agentbolt_torch.generation.engine import GenerationEngine, SamplingParams
from agentbolt_torch.policy import Policy


def kernel(rows: int, length: int, repeats: int = 30) -> dict[str, Any]:
    """One attention call both ways: milliseconds per call and whether the outputs are identical."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    heads, kv_heads, dim = 9, 3, 64
    query = torch.randn(rows, heads, 1, dim, dtype=torch.bfloat16)
    key = torch.randn(rows, kv_heads, length, dim, dtype=torch.bfloat16)
    value = torch.randn_like(key)
    mask = torch.ones(rows, 1, 1, length, dtype=torch.bool)
    mask[::2, :, :, : length // 8] = False  # left padding on every other row

    def repeated(x: torch.Tensor) -> torch.Tensor:
        return x[:, :, None].expand(rows, kv_heads, heads // kv_heads, length, dim).reshape(rows, heads, length, dim)

    def copied() -> torch.Tensor:
        return F.scaled_dot_product_attention(query, repeated(key), repeated(value), attn_mask=mask)

    def grouped() -> torch.Tensor:
        return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, enable_gqa=True)

    with torch.inference_mode():
        same = torch.equal(copied(), grouped())
        times = {}
        for name, call in (("sdpa (copies)", copied), ("grouped", grouped)):
            for _ in range(3):
                call()
            t0 = time.perf_counter()
            for _ in range(repeats):
                call()
            times[name] = (time.perf_counter() - t0) / repeats * 1000
    return {"rows": rows, "length": length, "ms": times, "identical": same}


def engine_round(policy: Policy, prompts: list[list[int]], new_tokens: int) -> tuple[float, list]:
    engine = GenerationEngine(policy, max_batch_size=4 * len(prompts), batch_window_s=0.05).start()
    try:
        params = [SamplingParams(max_tokens=new_tokens, ignore_eos=True, seed=1000 + i) for i in range(4)]
        t0 = time.perf_counter()
        handles = [engine.submit(prompt, p) for prompt in prompts for p in params]
        outputs = [h.wait(900)[0] for h in handles]
        seconds = time.perf_counter() - t0
    finally:
        engine.stop()
    tokens = sum(len(o.token_ids) for o in outputs)
    return tokens / seconds, [(o.token_ids, o.logprobs) for o in outputs]


def report(record: dict[str, Any]) -> None:
    """Print a run's figures (what a run prints, and ``--report`` from its record)."""
    k = record["kernel"]
    print(f"one attention call, {k['rows']} rows x {k['length']} cached positions, bf16, 9 heads on 3:")
    for name, ms in k["ms"].items():
        print(f"  {name:<14} {ms:7.2f} ms")
    print(f"  ratio {k['ms']['sdpa (copies)'] / k['ms']['grouped']:.2f}x; outputs bit-identical: {k['identical']}")
    e = record["engine"]
    print(
        f"\nengine, SmolLM2, {e['requests']} requests ({e['prompts']} prompts of {e['prompt_tokens']} tokens, "
        f"4 samples each), {e['new_tokens']} new tokens, autocast {e['autocast']}:"
    )
    rates = e["tokens_per_s"]
    for name, values in rates.items():
        print(
            f"  {name:<15} {statistics.median(values):7.1f} tokens/s (rounds: {', '.join(f'{v:.1f}' for v in values)})"
        )
    ratio = statistics.median(rates[ATTENTION_NAME]) / statistics.median(rates["sdpa"])
    print(f"  {ATTENTION_NAME} / sdpa: {ratio:.2f}x; same tokens and logprobs: {e['identical']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=32, help="concurrent requests (groups of 4 on rows/4 prompts)")
    parser.add_argument("--prompt-tokens", type=int, default=380)
    parser.add_argument("--new-tokens", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--record", type=Path, help="write the figures here as JSON")
    parser.add_argument("--report", type=Path, help="print the figures of a record (run nothing)")
    args = parser.parse_args()
    if args.report:
        report(json.loads(args.report.read_text()))
        return

    measured_kernel = kernel(args.rows, args.prompt_tokens + args.new_tokens // 2)

    import random

    policy = Policy.load("smollm2")
    assert policy.model.config._attn_implementation == ATTENTION_NAME
    rng = random.Random(0)
    vocab = len(policy.tokenizer)
    prompts = [
        [rng.randrange(100, vocab) for _ in range(args.prompt_tokens - 8 * k)] for k in range(max(1, args.rows // 4))
    ]
    rates: dict[str, list[float]] = {"sdpa": [], ATTENTION_NAME: []}
    outputs: dict[str, list] = {}
    for _ in range(args.rounds):
        for name in rates:
            policy.model.set_attn_implementation(name)
            rate, out = engine_round(policy, prompts, args.new_tokens)
            rates[name].append(round(rate, 1))
            outputs.setdefault(name, out)
    record = {
        "benchmark": "benchmarks/attention.py",
        "argv": sys.argv[1:],
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent
        ).stdout.strip(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "kernel": measured_kernel,
        "engine": {
            "requests": len(prompts) * 4,
            "prompts": len(prompts),
            "prompt_tokens": f"{min(map(len, prompts))}-{max(map(len, prompts))}",
            "new_tokens": args.new_tokens,
            "autocast": str(policy.autocast_dtype),
            "tokens_per_s": rates,
            "identical": outputs["sdpa"] == outputs[ATTENTION_NAME],
        },
    }
    report(record)
    if args.record:
        args.record.parent.mkdir(parents=True, exist_ok=True)
        args.record.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
