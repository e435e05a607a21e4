"""``examples/apo/train.py --fake``: the example runs end to end (fake policy, scripted optimizer)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "apo" / "train.py"


def test_apo_example_improves_the_prompt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the example inserts its folder
    spec = importlib.util.spec_from_file_location("apo_example_train", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result = module.main(
        ["--fake", "--runners", "0", "--store", f"sqlite:///{tmp_path}/apo.db", "--no-progress", "--val", "8"]
    )
    assert result.score_before == 0.0 and result.score_after == 1.0
    assert result.best_prompt.endswith("Reply with only the number, no words.")
