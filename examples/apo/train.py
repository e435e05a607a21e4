"""APO on an arithmetic agent: optimize its system prompt with an optimizer LLM.

    # No model at all: a fake policy and a scripted optimizer (seconds; shows the mechanics)
    uv run python examples/apo/train.py --fake

    # Any OpenAI-compatible endpoints, e.g. a vLLM server as the policy and OpenAI as the
    # optimizer (key in $OPENAI_API_KEY)
    uv run python examples/apo/train.py --policy-url http://127.0.0.1:8000/v1 \\
        --policy-model Qwen/Qwen2.5-1.5B-Instruct --optimizer-url https://api.openai.com/v1 --optimizer-model gpt-4.1-mini

    # SmolLM2-135M-Instruct served by agentbolt-torch, as the policy and (unless --optimizer-url) the optimizer
    uv run python examples/apo/train.py --smollm2

    # SmolLM2 as the policy, the scripted optimizer of --fake (its one edit: "Reply with only the number")
    uv run python examples/apo/train.py --smollm2 --scripted-optimizer

The agent (``apo_agent.py``) reads its system prompt from ``resources.prompts["system"]``. The
held-out score of the initial prompt and of the best prompt are printed at the end, with the
table of every prompt version APO tried.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # apo_agent.py and apo_tasks.py, also in the runner processes

from apo_agent import math_agent  # noqa: E402
from apo_tasks import fake_optimizer, fake_policy, make_tasks  # noqa: E402

from agentbolt.gateway import Upstream  # noqa: E402
from agentbolt.options import GatewayOptions, RunnerOptions  # noqa: E402
from agentbolt.trainer import Trainer  # noqa: E402
from agentbolt_apo import APO, APOResult  # noqa: E402

INITIAL_PROMPT = "You are a helpful math assistant."


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--fake", action="store_true", help="fake policy and scripted optimizer (no model)")
    mode.add_argument("--smollm2", action="store_true", help="serve SmolLM2-135M-Instruct with agentbolt-torch")
    p.add_argument(
        "--scripted-optimizer", action="store_true", help="the scripted optimizer of --fake with a real policy"
    )
    p.add_argument("--policy-url", help="OpenAI-compatible base URL of the policy (the agent's LLM)")
    p.add_argument("--policy-model", default="policy", help="the policy's model name")
    p.add_argument("--policy-key-env", default=None, help="env variable with the policy's API key")
    p.add_argument("--optimizer-url", help="OpenAI-compatible base URL of the optimizer LLM")
    p.add_argument("--optimizer-model", default="gpt-4.1-mini", help="the optimizer's model name")
    p.add_argument("--optimizer-key-env", default="OPENAI_API_KEY", help="env variable with the optimizer's API key")
    p.add_argument("--initial-prompt", default=INITIAL_PROMPT)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--beam-width", type=int, default=2)
    p.add_argument("--branch-factor", type=int, default=2)
    p.add_argument("--train-batch-size", type=int, default=4)
    p.add_argument("--train", type=int, default=32, help="training questions")
    p.add_argument("--val", type=int, default=16, help="held-out questions")
    p.add_argument("--runners", type=int, default=1, help="runner processes (0: in this process)")
    p.add_argument("--store", default="sqlite:///runs/apo.db")
    p.add_argument("--no-progress", action="store_true")
    return p.parse_args(argv)


def serve_smollm2(stack: ExitStack) -> str:
    """SmolLM2-135M-Instruct behind agentbolt-torch's OpenAI-compatible policy server."""
    from agentbolt_torch.generation.engine import GenerationEngine
    from agentbolt_torch.policy import Policy
    from agentbolt_torch.serving.server import PolicyServer

    policy = Policy.load("smollm2")
    server = stack.enter_context(
        PolicyServer(GenerationEngine(policy, default_max_tokens=256), served_model_name="smollm2")
    )
    return server.base_url


def main(argv: list[str] | None = None) -> APOResult:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    Path("runs").mkdir(exist_ok=True)
    options: dict[str, Any] = {
        "optimizer_model": args.optimizer_model,
        "optimizer_api_key_env": args.optimizer_key_env,
        "model": args.policy_model,
    }
    with ExitStack() as stack:
        if args.fake:
            from agentbolt.testing.fake_llm import FakeLLMServer

            policy_url = stack.enter_context(FakeLLMServer(fake_policy())).base_url
            optimizer = stack.enter_context(FakeLLMServer(fake_optimizer().fake_llm())).base_url
            options.update(optimizer_base_url=optimizer, optimizer_api_key_env=None, model="fake-model")
        elif args.smollm2:
            policy_url = serve_smollm2(stack)
            options["model"] = "smollm2"
            if args.optimizer_url is None:
                options.update(optimizer_base_url=policy_url, optimizer_model="smollm2", optimizer_api_key_env=None)
        else:
            if not args.policy_url:
                sys.exit("give --policy-url (and --optimizer-url), or --fake, or --smollm2")
            policy_url = args.policy_url
        if args.optimizer_url:
            options["optimizer_base_url"] = args.optimizer_url
        if args.scripted_optimizer:
            from agentbolt.testing.fake_llm import FakeLLMServer

            optimizer = stack.enter_context(FakeLLMServer(fake_optimizer().fake_llm())).base_url
            options.update(optimizer_base_url=optimizer, optimizer_model="fake-model", optimizer_api_key_env=None)
        key = os.environ.get(args.policy_key_env) if args.policy_key_env else None
        algorithm = APO(
            args.initial_prompt,
            rounds=args.rounds,
            beam_width=args.beam_width,
            branch_factor=args.branch_factor,
            train_batch_size=args.train_batch_size,
            **options,
        )
        trainer = Trainer(
            math_agent,
            algorithm=algorithm,
            store=args.store,
            gateway=GatewayOptions(upstreams=Upstream(base_url=policy_url, api_key=key, model=options["model"])),
            runners=RunnerOptions(n=args.runners),
            progress=not args.no_progress,
            run={"name": "apo-example"},
        )
        result: APOResult = trainer.fit(
            make_tasks(args.train, seed=1, prefix="train-"), make_tasks(args.val, seed=2, prefix="val-")
        )
    print(f"held-out score: initial prompt {result.score_before:.3f}, best prompt {result.score_after:.3f}")
    print(f"prompt versions tried: {len(result.versions)}, malformed optimizer answers: {result.malformed_answers}")
    print(f"best prompt (resources version {result.published_version}):\n{result.best_prompt}")
    return result


if __name__ == "__main__":
    main()
