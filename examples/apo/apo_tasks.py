"""Small arithmetic questions and, for ``train.py --fake``, a fake policy and optimizer."""

from __future__ import annotations

import random
import re

from agentbolt.testing.fake_llm import FakeLLM, FakeRequest
from agentbolt_apo.testing import EditRequest, ScriptedOptimizer


def make_tasks(n: int, *, seed: int, prefix: str) -> list[dict[str, object]]:
    """``n`` questions ``What is a + b?`` / ``a - b`` with their integer answers."""
    rng = random.Random(seed)
    tasks = []
    for i in range(n):
        a, b = rng.randint(2, 40), rng.randint(2, 40)
        op = rng.choice("+-")
        tasks.append(
            {"task_id": f"{prefix}{i}", "question": f"What is {a} {op} {b}?", "answer": a + b if op == "+" else a - b}
        )
    return tasks


def fake_policy() -> FakeLLM:
    """Answers right, but only bare when its system prompt asks for ``only the number``."""

    def reply(request: FakeRequest) -> str:
        messages = request.messages or []
        system = " ".join(str(m.get("content", "")) for m in messages if m.get("role") == "system").lower()
        a, op, b = re.search(r"(-?\d+) ([+-]) (-?\d+)", str(messages[-1].get("content", ""))).groups()  # type: ignore[union-attr]
        answer = int(a) + int(b) if op == "+" else int(a) - int(b)
        return str(answer) if "only the number" in system else f"The answer is {answer}."

    return FakeLLM(default_reply=reply)


def fake_optimizer() -> ScriptedOptimizer:
    """A scripted optimizer: one critique, and an edit asking for the bare number."""

    def edit(req: EditRequest) -> str:
        return f"<prompt>{req.prompt} Reply with only the number, no words.</prompt>"

    return ScriptedOptimizer(
        critique="The replies put the number in a sentence; the reward accepts only the bare number.", edit=edit
    )
