"""agentbolt-torch on SmolLM2-135M-Instruct (CPU): generation throughput and one update step.

Run:  MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736 MALLOC_TOP_PAD_=1073741824 \\
      uv run python benchmarks/torch_policy.py [--batches 1 16 32] [--new-tokens 64] [--http] [--update-seqs 32]

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
from agentbolt_torch.engine import GenerationEngine, SamplingParams
from agentbolt_torch.policy import Policy
from agentbolt_torch.update import PolicyUpdater, UpdateConfig

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 32])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--http", action="store_true", help="also measure through the HTTP server")
    parser.add_argument("--update-seqs", type=int, default=32)
    parser.add_argument("--skip-update", action="store_true")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    args = parser.parse_args()
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch threads {torch.get_num_threads()}; {cpu_pressure()}")

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
        from agentbolt_torch.server import PolicyServer

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
