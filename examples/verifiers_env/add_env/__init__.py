"""``add-env``: a verifiers environment written with verifiers' own API (``verifiers.v1``):
two-number addition with a worked example, answered as ``<answer>N</answer>``.

- ``AddData``: the row (the question as a few-shot Messages prompt, the answer, the split);
- ``AddTask``: its reward ``correct`` (weight 1: the ``<answer>`` holds the sum) and metric
  ``formatted`` (an ``<answer>`` tag with a number is there);
- ``AddTaskset``: generated here, no hub download. ``split="train"`` and ``split="heldout"``
  share no question by construction (:func:`is_heldout` on the operand pair).

    vf-eval add-env --env.agent.harness.id null --env.agent.runtime.type subprocess -n 5 ...
"""

from __future__ import annotations

import random
import re
from typing import Literal

import verifiers.v1 as vf

SYSTEM = "You are a helpful assistant. Always give the final answer as a number inside <answer>...</answer>."
ANSWER = re.compile(r"<answer>\s*(-?\d+)\s*</answer>")


def is_heldout(a: int, b: int) -> bool:
    """Which operand pairs only the held-out split asks (one in five, by a fixed hash)."""
    return (a * 31 + b * 17) % 5 == 0


def parse_answer(text: str) -> int | None:
    """The number in the last ``<answer>...</answer>``, or ``None``."""
    found = ANSWER.findall(text or "")
    return int(found[-1]) if found else None


def question(a: int, b: int) -> str:
    return f"What is {a} + {b}?"


class AddData(vf.TaskData):
    answer: int
    split: str


class AddTask(vf.Task[AddData]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return 1.0 if parse_answer(trace.last_reply) == self.data.answer else 0.0

    @vf.metric
    async def formatted(self, trace: vf.Trace) -> float:
        return 0.0 if parse_answer(trace.last_reply) is None else 1.0


class AddConfig(vf.TasksetConfig):
    split: Literal["train", "heldout"] = "train"
    """Which questions: training ones, or held-out ones no training question asks."""
    num_tasks: int = 2000
    seed: int = 0


class AddTaskset(vf.Taskset[AddTask, AddConfig]):
    def load(self) -> list[AddTask]:
        rng = random.Random(f"{self.config.split}-{self.config.seed}")
        held = self.config.split == "heldout"
        seen: set[tuple[int, int]] = set()
        tasks: list[AddTask] = []
        while len(tasks) < self.config.num_tasks and len(seen) < 40 * 30:
            a, b = rng.randint(10, 49), rng.randint(1, 30)
            if (a, b) in seen or is_heldout(a, b) != held:
                seen.add((a, b))
                continue
            seen.add((a, b))
            prompt = [
                {"role": "user", "content": question(3, 5)},
                {"role": "assistant", "content": "3 + 5 = 8. <answer>8</answer>"},
                {"role": "user", "content": question(a, b)},
            ]
            data = AddData(
                id=f"{self.config.split}-{a}-{b}",
                prompt=prompt,
                system_prompt=SYSTEM,
                answer=a + b,
                split=self.config.split,
            )
            tasks.append(AddTask(data, self.config.task))
        return tasks


__all__ = ["AddTaskset"]
