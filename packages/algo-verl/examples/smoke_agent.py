"""A one-call agent for the GPU smoke run: asks the policy to repeat a word; reward 1 if it does.

It is a plain OpenAI client: the runner hands it the gateway's per-rollout base URL through
``resources.llm``.
"""

from __future__ import annotations

import json
import random
import sys

WORDS = ["apple", "river", "stone", "cloud", "tiger", "maple", "ocean", "pixel"]


def agent(task, resources) -> float:
    from openai import OpenAI

    client = OpenAI(base_url=resources.llm.base_url, api_key=resources.llm.api_key or "none")
    word = task.input["word"]
    reply = client.chat.completions.create(
        model=resources.llm.model,
        messages=[{"role": "user", "content": f"Reply with exactly one word, in lowercase: {word}"}],
        max_tokens=16,
    )
    text = (reply.choices[0].message.content or "").strip().lower().strip(".!\"' ")
    return 1.0 if text == word else 0.0


def write_tasks(n: int = 64, seed: int = 0) -> None:
    """Print ``n`` tasks as JSON Lines (agentbolt Task objects)."""
    rng = random.Random(seed)
    for i in range(n):
        print(json.dumps({"task_id": f"word-{i}", "input": {"word": rng.choice(WORDS)}}))


if __name__ == "__main__":
    write_tasks(int(sys.argv[1]) if len(sys.argv) > 1 else 64)
