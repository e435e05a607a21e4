"""The quickstart's held-out arithmetic problems are never training problems."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("quickstart_math_tasks", REPO / "examples/quickstart/math_tasks.py")
assert spec is not None and spec.loader is not None
math_tasks = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = math_tasks
spec.loader.exec_module(math_tasks)


def test_heldout_problems_are_disjoint_from_training() -> None:
    train = math_tasks.make_tasks(4000, seed=1, prefix="train-", heldout=False)
    val = math_tasks.make_tasks(96, seed=2, prefix="val-", heldout=True)
    assert not {t["question"] for t in train} & {t["question"] for t in val}
    assert len({t["question"] for t in val}) == 96  # distinct held-out problems
    assert len({t["question"] for t in train}) > 900 and [t["task_id"] for t in val[:2]] == ["val-0", "val-1"]
    for task in val:
        a, op, b = task["question"].removeprefix("What is ").removesuffix("?").split()
        assert math_tasks.is_heldout(int(a), op, int(b))
        assert task["answer"] == (int(a) + int(b) if op == "+" else int(a) - int(b))


def test_heldout_size_is_bounded_by_the_problems() -> None:
    assert math_tasks.N_HELDOUT_PROBLEMS == 144
    assert len(math_tasks.make_tasks(144, seed=3, prefix="v", heldout=True)) == 144
    with pytest.raises(ValueError, match="there are 144 held-out problems"):
        math_tasks.make_tasks(145, seed=3, prefix="v", heldout=True)
