"""Trivial policies on the quickstart's held-out questions: what its accuracy means only beside these.

Each policy answers without computing, scored with the agent's own reward
(:func:`math_tasks.reward`; a question counts as correct at reward 1.0):

- ``constant``: the last worked example's answer (16), what a model that copies its prompt says;
- ``format_only``: a well-formed ``<answer>0</answer>``;
- ``most_frequent``: the held-out set's own most frequent answer (an upper bound for any
  policy that always gives the same number);
- ``first_operand``: the first number of the question.

and one rule-based solver (:func:`rule_scores`), ``parse_and_compute``: a regular expression
reads ``a + b`` / ``a - b`` from the question and Python computes it (1.000: the task is
arithmetic a 135M model gets wrong, not arithmetic a program cannot do).

    uv run python examples/quickstart/baselines.py
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from math_tasks import HELDOUT_SET, make_tasks, reward  # noqa: E402

N_HELDOUT = 96
"""The held-out questions of the default run (``train.py --val``)."""


BUNDLED_DATA_MEASURES = (
    'The questions are one template, "What is a + b?" or "What is a - b?" (a <= 30, b <= 20): a '
    "regular expression and Python answer every one, so the held-out set measures whether SmolLM2's "
    "own two-digit arithmetic improves on problems it was not trained on."
)
"""One sentence on what the held-out questions measure (printed with the figures)."""

_QUESTION = re.compile(r"What is (-?\d+) ([+-]) (-?\d+)\?")


def parse_and_compute(question: str) -> str:
    """The rule-based solver: read ``a op b`` and compute it."""
    m = _QUESTION.fullmatch(question)
    if m is None:
        return "<answer></answer>"
    a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
    return f"<answer>{a + b if op == '+' else a - b}</answer>"


def rule_scores(data_dir: Path | None = None) -> list[dict[str, Any]]:
    """The rule-based solver's row on the default held-out questions (same keys as :func:`trivial_scores`)."""
    val = make_tasks(N_HELDOUT, seed=2, prefix="val-", heldout=True)
    correct = [reward(parse_and_compute(t["question"]), int(t["answer"])) >= 1.0 for t in val]
    return [
        {
            "heldout": HELDOUT_SET,
            "policy": "parse_and_compute",
            "metric": "accuracy",
            "score": sum(correct) / len(val),
            "n": len(val),
        }
    ]


def trivial_scores(data_dir: Path | None = None, val: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """One row per policy on the default held-out questions, or on ``val`` (``data_dir`` is not
    used: the data is code)."""
    val = val if val is not None else make_tasks(N_HELDOUT, seed=2, prefix="val-", heldout=True)
    frequent = Counter(t["answer"] for t in val).most_common(1)[0][0]
    policies = {
        "constant": lambda t: "<answer>16</answer>",
        "format_only": lambda t: "<answer>0</answer>",
        "most_frequent": lambda t: f"<answer>{frequent}</answer>",
        "first_operand": lambda t: f"<answer>{re.findall(r'-?[0-9]+', t['question'])[0]}</answer>",
    }
    rows = []
    for policy, answer in policies.items():
        correct = [reward(answer(t), int(t["answer"])) >= 1.0 for t in val]
        rows.append(
            {
                "heldout": HELDOUT_SET,
                "policy": policy,
                "metric": "accuracy",
                "score": sum(correct) / len(val),
                "n": len(val),
            }
        )
    return rows


if __name__ == "__main__":
    for row in trivial_scores():
        print(f"{row['heldout']:<8} {row['policy']:<14} {row['metric']} {row['score']:.3f} (n={row['n']})")
    for row in rule_scores():
        print(f"{row['heldout']:<8} {row['policy']:<14} {row['metric']} {row['score']:.3f} (n={row['n']}, rule)")
