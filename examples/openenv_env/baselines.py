"""Trivial policies on the example's held-out episodes: what its accuracy means only beside these.

The held-out episodes are ``reset(seed=i, split="test")`` for i < 32 (two questions each, from the
problems the ``train`` split never asks, ``openenv_arith.is_heldout``). Each policy answers every
question without computing; the score is the example's accuracy: the share of episodes with both
questions answered right (episode return 1.0):

- ``constant``: the few-shot episode's last answer (16);
- ``format_only``: 0;
- ``most_frequent``: the held-out set's own most frequent answer (a bound for any constant);
- ``first_operand``: the first number of the question.

and one rule-based solver (:func:`rule_scores`), ``parse_and_compute`` (1.000: a regular
expression and Python answer every question).

    uv run python examples/openenv_env/baselines.py
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from openenv_arith import answer_of, episode_problems  # noqa: E402

N_HELDOUT = 32
"""Held-out episodes of the default run (``train.py --val``), two questions each."""

BUNDLED_DATA_MEASURES = (
    'Each episode asks two questions of one template, "What is a + b?" or "What is a - b?" (a <= 30, '
    "b <= 20): a regular expression and Python answer every one, so the held-out set measures whether "
    "SmolLM2's own arithmetic, over a two-step episode, improves on problems it was not trained on."
)
"""One sentence on what the held-out episodes measure (printed with the figures)."""

Problem = tuple[int, str, int]


def heldout_problems(n: int = N_HELDOUT) -> list[list[Problem]]:
    """The problems of each held-out episode, in order."""
    return [episode_problems(seed, "test") for seed in range(n)]


def _score(policy: Callable[[Problem], int], n: int) -> float:
    episodes = heldout_problems(n)
    solved = [all(policy(p) == answer_of(p) for p in episode) for episode in episodes]
    return sum(solved) / len(solved)


def trivial_scores(data_dir: Path | None = None, n: int = N_HELDOUT) -> list[dict[str, Any]]:
    """One row per trivial policy on the held-out episodes (``data_dir`` is unused: the data is code)."""
    frequent = Counter(answer_of(p) for e in heldout_problems(n) for p in e).most_common(1)[0][0]
    policies: dict[str, Callable[[Problem], int]] = {
        "constant": lambda p: 16,
        "format_only": lambda p: 0,
        "most_frequent": lambda p: frequent,
        "first_operand": lambda p: p[0],
    }
    return [
        {"heldout": "heldout", "policy": name, "metric": "accuracy", "score": _score(policy, n), "n": n}
        for name, policy in policies.items()
    ]


def rule_scores(data_dir: Path | None = None, n: int = N_HELDOUT) -> list[dict[str, Any]]:
    """The rule-based solver's row (same keys as :func:`trivial_scores`)."""
    return [
        {
            "heldout": "heldout",
            "policy": "parse_and_compute",
            "metric": "accuracy",
            "score": _score(answer_of, n),
            "n": n,
        }
    ]


if __name__ == "__main__":
    for row in trivial_scores() + rule_scores():
        print(f"{row['policy']:<18} {row['metric']} {row['score']:.3f} (n={row['n']} episodes)")
