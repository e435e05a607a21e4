"""agentbolt-torch on SmolLM2-135M-Instruct (CPU): generation throughput and one update step.

Run:  MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736 MALLOC_TOP_PAD_=1073741824 \\
      uv run python benchmarks/torch_policy.py [--batches 1 16 32] [--new-tokens 64] [--http] [--update-seqs 32]
      uv run python benchmarks/torch_policy.py --adapters 1 2 4 [--batches 1 16 32] [--rounds 3] [--model tiny]

Prints:
- a greedy answer (sanity check of the converted weights and the chat template);
- generation throughput of the engine (tokens/s, total over the batch) for N concurrent requests
  of one short chat prompt (its length is printed) generating ``--new-tokens`` each (eos ignored), best of 2 after a
  warm-up; with ``--http`` the same through the OpenAI-compatible server and the openai client.
  The requests share one prompt, which the engine's prompt cache prefills once: the figures are
  decoding throughput;
- one full fine-tune update (bf16 autocast, fp32 master weights, AdamW) on ``--update-seqs``
  sequences of about 150 tokens (110-token prompt + 40-token response): seconds, tokens/s,
  peak RSS. The first update is a warm-up; the second is reported.

``--adapters 1 2 4`` measures instead the cost of policies by role: the serving throughput of the
single-policy engine (no adapter), of one LoRA policy, and of one base model with 1, 2 and 4 LoRA
adapters (rank ``--rank``) with the same load (``--batches`` concurrent requests, spread round-robin
over the adapters, so every decode step is a mixed-adapter batch). The configurations are measured
in alternation, ``--rounds`` times each, and reported as the median with its ratio to the
single-policy engine: on a shared machine only the ratios mean something.

CPU contention matters a lot on small machines: with other processes busy, PyTorch's default
OpenMP spin-waiting makes 2 threads several times slower than 1. The script prints the CPU
pressure (``/proc/pressure/cpu``) next to the figures; try ``--threads 1`` and
``OMP_WAIT_POLICY=PASSIVE`` when the machine is shared.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import random
import resource
import time

from agentbolt.types import Transition
from agentbolt_torch.generation.engine import GenerationEngine, SamplingParams
from agentbolt_torch.policy import Policy
from agentbolt_torch.update.updater import PolicyUpdater, UpdateConfig

SYSTEM = "You are a helpful assistant."


def cpu_pressure() -> str:
    try:
        with open("/proc/pressure/cpu") as f:
            return "cpu pressure: " + f.readline().strip()
    except OSError:
        return "cpu pressure: n/a"


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6


def bench_engine(engine: GenerationEngine, prompt: list[int], batch: int, new_tokens: int) -> float:
    best = 0.0
    for _ in range(3):  # warm-up + 2
        params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
        t0 = time.perf_counter()
        handles = [engine.submit(prompt, params) for _ in range(batch)]
        total = sum(len(h.wait(600)[0].token_ids) for h in handles)
        best = max(best, total / (time.perf_counter() - t0))
    return best


def bench_http(base_url: str, messages: list[dict[str, str]], batch: int, new_tokens: int) -> float:
    import openai

    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=600)

    def one(_: int) -> int:
        r = client.chat.completions.create(
            model="smollm2",
            messages=messages,
            max_tokens=new_tokens,
            logprobs=True,
            extra_body={"return_token_ids": True, "ignore_eos": True},
        )
        return len(r.choices[0].token_ids)

    best = 0.0
    with concurrent.futures.ThreadPoolExecutor(batch) as pool:
        for _ in range(2):
            t0 = time.perf_counter()
            total = sum(pool.map(one, range(batch)))
            best = max(best, total / (time.perf_counter() - t0))
    return best


def bench_adapters(args: argparse.Namespace) -> None:
    """Throughput of 0 (the single-policy engine), one LoRA policy, and 1..N adapters, interleaved."""
    import statistics

    from agentbolt_torch.chat import render_chat
    from agentbolt_torch.policy import LoraSettings

    lora = LoraSettings(r=args.rank, alpha=2 * args.rank)
    configs: dict[str, tuple[Policy, list[str | None]]] = {}
    t0 = time.perf_counter()
    configs["single policy (no adapter)"] = (Policy.load(args.model), [None])
    configs[f"single LoRA policy (r={args.rank})"] = (Policy.load(args.model, lora=lora), [None])
    for n in args.adapters:
        names = [f"role{i}" for i in range(n)]
        policy = Policy.load(args.model, adapters=dict.fromkeys(names, lora))
        configs[f"{n} adapter{'s' if n > 1 else ''} (r={args.rank}), requests round-robin"] = (policy, list(names))
    print(f"loaded {len(configs)} policies in {time.perf_counter() - t0:.1f} s; peak RSS {peak_rss_gb():.2f} GB")
    any_policy = next(iter(configs.values()))[0]
    tok = any_policy.tokenizer
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is the capital of France?"}]
    prompt = tok(render_chat(tok, messages), add_special_tokens=False)["input_ids"]
    print(
        f"model {args.model}; autocast {any_policy.autocast_dtype}; {len(prompt)}-token prompt, {args.new_tokens} new tokens per request"
    )
    engines = {
        label: GenerationEngine(policy, max_batch_size=max(args.batches), batch_window_s=0.05).start()
        for label, (policy, _) in configs.items()
    }
    params = SamplingParams(max_tokens=args.new_tokens, ignore_eos=True)
    rates: dict[tuple[str, int], list[float]] = {}
    for label, engine in engines.items():  # warm-up (and the per-adapter prompt prefill)
        adapters = configs[label][1]
        for h in [engine.submit(prompt, params, adapter=adapters[i % len(adapters)]) for i in range(4)]:
            h.wait(600)
    for round_ in range(args.rounds):
        for batch in args.batches:
            for label, engine in engines.items():
                adapters = configs[label][1]
                t1 = time.perf_counter()
                handles = [engine.submit(prompt, params, adapter=adapters[i % len(adapters)]) for i in range(batch)]
                total = sum(len(h.wait(600)[0].token_ids) for h in handles)
                rates.setdefault((label, batch), []).append(total / (time.perf_counter() - t1))
        print(f"round {round_ + 1}/{args.rounds} done; {cpu_pressure()}", flush=True)
    for engine in engines.values():
        engine.stop()
    baseline = "single policy (no adapter)"
    for batch in args.batches:
        base = statistics.median(rates[(baseline, batch)])
        for label in engines:
            rate = statistics.median(rates[(label, batch)])
            print(f"serving batch {batch:3d}  {label:45s} {rate:7.1f} tokens/s  ({rate / base:.2f} x single policy)")
    print(f"peak RSS {peak_rss_gb():.2f} GB; {cpu_pressure()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 32])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--http", action="store_true", help="also measure through the HTTP server")
    parser.add_argument("--update-seqs", type=int, default=32)
    parser.add_argument("--skip-update", action="store_true")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument(
        "--adapters", type=int, nargs="+", default=None, help="measure serving with these numbers of LoRA adapters"
    )
    parser.add_argument(
        "--model", default="smollm2", help="for --adapters: smollm2 (default) or tiny (a random model, seconds)"
    )
    parser.add_argument("--rank", type=int, default=16, help="LoRA rank for --adapters (default 16)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating measurements per configuration")
    args = parser.parse_args()
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch threads {torch.get_num_threads()}; {cpu_pressure()}")
    if args.adapters:
        bench_adapters(args)
        return

    t0 = time.perf_counter()
    policy = Policy.load("smollm2")
    print(f"loaded SmolLM2 in {time.perf_counter() - t0:.1f} s; peak RSS {peak_rss_gb():.2f} GB")
    tok = policy.tokenizer
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is the capital of France?"}]
    from agentbolt_torch.chat import render_chat

    prompt = tok(render_chat(tok, messages), add_special_tokens=False)["input_ids"]
    engine = GenerationEngine(policy, max_batch_size=max(args.batches), batch_window_s=0.05).start()
    greedy = engine.generate(prompt, SamplingParams(max_tokens=32, temperature=0), timeout=600)[0]
    print(f"greedy answer ({len(prompt)}-token prompt): {greedy.text!r}")

    for batch in args.batches:
        rate = bench_engine(engine, prompt, batch, args.new_tokens)
        print(f"engine  batch {batch:3d}: {rate:7.1f} tokens/s ({args.new_tokens} new tokens each)")
    if args.http:
        from agentbolt_torch.serving.server import PolicyServer

        with PolicyServer(engine, served_model_name="smollm2") as server:
            for batch in args.batches:
                rate = bench_http(server.base_url, messages, batch, args.new_tokens)
                print(f"http    batch {batch:3d}: {rate:7.1f} tokens/s")
    engine.stop()
    print(f"peak RSS after generation {peak_rss_gb():.2f} GB; {cpu_pressure()}")

    if args.skip_update:
        return
    rng = random.Random(0)
    vocab = policy.base_model.config.vocab_size
    transitions = []
    for i in range(args.update_seqs):
        prompt_len, response_len = rng.randint(100, 120), rng.randint(30, 50)
        transitions.append(
            Transition(
                rollout_id=f"r{i}",
                index=0,
                prompt_ids=[rng.randrange(3, vocab) for _ in range(prompt_len)],
                response_ids=[rng.randrange(3, vocab) for _ in range(response_len)],
                advantage=rng.uniform(-1, 1),
            )
        )
    tokens = sum(len(t.prompt_ids) + len(t.response_ids) for t in transitions)
    updater = PolicyUpdater(policy, UpdateConfig(lr=1e-6))
    for label in ("warm-up", "measured"):
        metrics = updater.update(transitions)
        print(
            f"update ({label}): {len(transitions)} seqs, {tokens} tokens ({tokens / len(transitions):.0f}/seq), "
            f"{metrics.micro_batches} micro-batches: {metrics.seconds:.2f} s, {metrics.tokens_per_s:.0f} tokens/s, "
            f"loss {metrics.loss:.4f}, peak RSS {peak_rss_gb():.2f} GB; {cpu_pressure()}"
        )


if __name__ == "__main__":
    main()
