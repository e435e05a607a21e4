"""Trivial policies on the held-out questions of ``add-env``: what its accuracy means only beside these.

Each policy answers without adding, scored by the environment's own rule (``add_env.parse_answer``
equal to the sum, what its ``correct`` reward checks):

- ``constant``: the worked example's answer (8), what a model that copies its prompt says;
- ``format_only``: a well-formed ``<answer>0</answer>``;
- ``most_frequent``: the held-out set's own most frequent sum;
- ``first_operand``: the first number of the question.

and one rule-based solver, ``parse_and_compute`` (a regular expression reads ``a + b``, Python
adds: 1.000, the task is arithmetic a 135M model gets wrong, not one a program cannot do).

    uv run python examples/verifiers_env/baselines.py
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from add_env import AddConfig, AddTaskset, parse_answer  # noqa: E402

N_HELDOUT = 48
"""The held-out questions of the default run (``train.py --val``)."""

BUNDLED_DATA_MEASURES = (
    'The questions are one template, "What is a + b?" (10 <= a <= 49, 1 <= b <= 30), the held-out '
    "pairs never asked in training: a regular expression and Python answer every one, so the held-out "
    "set measures whether SmolLM2's own two-digit addition improves on problems it was not trained on."
)
"""One sentence on what the held-out questions measure (printed with the figures)."""


def heldout(n: int = N_HELDOUT) -> list[dict[str, Any]]:
    """The held-out questions as ``{"question", "answer"}`` (the environment's own rows)."""
    tasks = AddTaskset(AddConfig(id="add-env", split="heldout", num_tasks=n)).load()
    return [{"question": t.data.prompt[-1].content, "answer": t.data.answer} for t in tasks]


def _rows(policies: dict[str, Any], val: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for policy, answer in policies.items():
        correct = [parse_answer(answer(t)) == t["answer"] for t in val]
        rows.append(
            {
                "heldout": "heldout",
                "policy": policy,
                "metric": "accuracy",
                "score": sum(correct) / len(val),
                "n": len(val),
            }
        )
    return rows


def parse_and_compute(question: str) -> str:
    """The rule-based solver: read ``a + b`` and add."""
    a, b = map(int, re.fullmatch(r"What is (\d+) \+ (\d+)\?", question).groups())  # type: ignore[union-attr]
    return f"<answer>{a + b}</answer>"


def rule_scores(data_dir: Path | None = None) -> list[dict[str, Any]]:
    """The rule-based solver's row on the default held-out questions."""
    return _rows({"parse_and_compute": lambda t: parse_and_compute(t["question"])}, heldout())


def trivial_scores(data_dir: Path | None = None, val: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """One row per trivial policy on the default held-out questions (``data_dir`` is not used:
    the data is code)."""
    val = val if val is not None else heldout()
    frequent = Counter(t["answer"] for t in val).most_common(1)[0][0]
    return _rows(
        {
            "constant": lambda t: "<answer>8</answer>",
            "format_only": lambda t: "<answer>0</answer>",
            "most_frequent": lambda t: f"<answer>{frequent}</answer>",
            "first_operand": lambda t: f"<answer>{re.findall(r'[0-9]+', t['question'])[0]}</answer>",
        },
        val,
    )


if __name__ == "__main__":
    for row in trivial_scores():
        print(f"{row['heldout']:<8} {row['policy']:<14} {row['metric']} {row['score']:.3f} (n={row['n']})")
    for row in rule_scores():
        print(f"{row['heldout']:<8} {row['policy']:<18} {row['metric']} {row['score']:.3f} (n={row['n']}, rule)")
