"""Trivial policies on the calculator agent's held-out tiers: what a score means.

Each policy answers every held-out question without solving it, and is scored with the agent's
own reward (:func:`scoring.reward`; correct = reward 1.0), one row per (tier, policy):

- ``constant``: the most frequent answer of the *training* set, every time;
- ``most_frequent``: the held-out tier's own most frequent answer (the best any constant can do);
- ``format_only``: well-formed tags with no number in them;
- ``first_number`` / ``last_number``: a number copied from the question.

    uv run python examples/calc_agent/baselines.py    # prints the table

Rule-based solvers read the question (:func:`rule_scores`): ``keyword_rules``, six keyword
rules, one per problem template of the bundled data (``finds ... loses``: a + b - c; ``packs ...
loose``: a x b + c; ``gives away``/``sold``: a - b; ``more``/``in all``: a + b; ``equally``/
``equal boxes``: a / b; ``each``/``holds``: a x b), and ``first_times_second``, the first
number times the second.

``benchmarks/examples.py`` prints these beside the trained model's figures, and a CI test asserts
that none of them scores above 0.10 on the bundled tiers.
"""

from __future__ import annotations

import importlib
import pathlib
import re
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
_SIBLINGS = ("bundled", "chains", "data", "scoring")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def load_siblings() -> dict[str, ModuleType]:
    """This example's modules (data, scoring, ...), imported without disturbing ``sys.modules``:
    the other examples have modules of the same names (``data``), so whatever was registered under
    those names before is put back."""
    saved = {name: sys.modules.pop(name, None) for name in _SIBLINGS}
    sys.path.insert(0, str(HERE))
    try:
        return {name: importlib.import_module(name) for name in _SIBLINGS}
    finally:
        sys.path.remove(str(HERE))
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def _numbers(question: str) -> list[str]:
    return _NUMBER.findall(question.replace(",", ""))


def _policies(train: Sequence[dict[str, Any]], tier: Sequence[dict[str, Any]]) -> dict[str, Callable[[str], str]]:
    def fmt(value: float) -> str:
        return str(int(value)) if float(value).is_integer() else str(value)

    train_mode = fmt(Counter(t["answer"] for t in train).most_common(1)[0][0])
    tier_mode = fmt(Counter(t["answer"] for t in tier).most_common(1)[0][0])
    return {
        "constant": lambda q: f"<answer>{train_mode}</answer>",
        "most_frequent": lambda q: f"<answer>{tier_mode}</answer>",
        "format_only": lambda q: "<answer></answer>",
        "first_number": lambda q: f"<answer>{(_numbers(q) or [''])[0]}</answer>",
        "last_number": lambda q: f"<answer>{(_numbers(q) or [''])[-1]}</answer>",
    }


BUNDLED_DATA_MEASURES = (
    "The bundled problems come from a few sentence templates per operation: six keyword rules compute "
    "every held-out answer, so the tiers measure whether the model learns to call the calculator with "
    "the right expression (the large tier's numbers are beyond a 135M model's own arithmetic), not "
    "reading comprehension."
)
"""One sentence on what the bundled held-out tiers measure (printed with the figures)."""

_KEYWORD_RULES: tuple[tuple[str, Callable[[list[float]], float]], ...] = (
    (r"finds .* loses", lambda n: n[0] + n[1] - n[2]),
    (r"packs .* loose", lambda n: n[0] * n[1] + n[2]),
    (r"gave .* away|sold", lambda n: n[0] - n[1]),
    (r"equally|equal boxes", lambda n: n[0] / n[1]),
    (r"more\b|in all", lambda n: n[0] + n[1]),
    (r"in each|holds", lambda n: n[0] * n[1]),
)


def keyword_rules(question: str) -> str:
    """The first keyword rule that matches ``question``, applied to its numbers in order."""
    numbers = [float(x) for x in _numbers(question)]
    for pattern, compute in _KEYWORD_RULES:
        if re.search(pattern, question):
            try:
                value = compute(numbers)
            except (IndexError, ZeroDivisionError):
                return "<answer></answer>"
            return f"<answer>{int(value) if float(value).is_integer() else value}</answer>"
    return "<answer></answer>"


def first_times_second(question: str) -> str:
    numbers = _numbers(question)
    return (
        f"<answer>{int(float(numbers[0]) * float(numbers[1]))}</answer>" if len(numbers) >= 2 else "<answer></answer>"
    )


def rule_scores(data_dir: pathlib.Path | None = None) -> list[dict]:
    """Accuracy of the rule-based solvers on each held-out tier (same keys as :func:`trivial_scores`)."""
    modules = load_siblings()
    _, tiers = modules["data"].load(data_dir)
    reward, correct = modules["scoring"].reward, modules["scoring"].CORRECT
    rows = []
    for tier, tasks in tiers.items():
        for policy, answer in (("keyword_rules", keyword_rules), ("first_times_second", first_times_second)):
            hits = sum(reward(answer(t["question"]), t["answer"]) >= correct for t in tasks)
            rows.append(
                {"heldout": tier, "policy": policy, "metric": "accuracy", "score": hits / len(tasks), "n": len(tasks)}
            )
    return rows


def trivial_scores(data_dir: pathlib.Path | None = None) -> list[dict]:
    """Accuracy of each trivial policy on each held-out tier of ``data_dir`` (default: the bundled set)."""
    modules = load_siblings()
    train, tiers = modules["data"].load(data_dir)
    reward, correct = modules["scoring"].reward, modules["scoring"].CORRECT
    rows = []
    for tier, tasks in tiers.items():
        for policy, answer in _policies(train, tasks).items():
            hits = sum(reward(answer(t["question"]), t["answer"]) >= correct for t in tasks)
            rows.append(
                {"heldout": tier, "policy": policy, "metric": "accuracy", "score": hits / len(tasks), "n": len(tasks)}
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Trivial policies' accuracy on the calc agent's held-out tiers.")
    parser.add_argument("--data", type=pathlib.Path, default=None, help="a Calc-X folder (default: bundled)")
    args = parser.parse_args(argv)
    print(f"{'tier':8} {'policy':14} {'accuracy':>8} {'n':>5}")
    for row in trivial_scores(args.data):
        print(f"{row['heldout']:8} {row['policy']:14} {row['score']:8.3f} {row['n']:5d}")
    for row in rule_scores(args.data):
        print(f"{row['heldout']:8} {row['policy']:14} {row['score']:8.3f} {row['n']:5d}  (rule)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
