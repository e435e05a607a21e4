"""examples/calc_agent's held-out tiers share nothing with training, by construction, and no
trivial policy scores on them: checked on the bundled files as written."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "calc_agent"


def _baselines() -> ModuleType:
    spec = importlib.util.spec_from_file_location("calc_agent_example_baselines", EXAMPLE / "baselines.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


baselines = _baselines()
modules = baselines.load_siblings()
bundled, chains, data = modules["bundled"], modules["chains"], modules["data"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return bundled.write_bundled(tmp_path_factory.mktemp("calc") / "bundled")


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_held_out_tiers_share_no_step_and_no_chain_with_training(folder: Path) -> None:
    train = _records(folder / "train.jsonl")
    for tier in bundled.TIERS:
        heldout = _records(folder / f"test_{tier}.jsonl")
        assert len(heldout) == 200
        assert chains.overlap(train, heldout) == chains.Overlap(n=200, shared_chains=0, shared_steps=0)
    # the loader drops nothing from the bundled tiers (there is nothing to drop)
    loaded_train, tiers = data.load(folder)
    assert len(loaded_train) == 800 and {t: len(v) for t, v in tiers.items()} == {"large": 200, "small": 200}


def test_large_tier_needs_the_calculator(folder: Path) -> None:
    """Every large-tier problem has a step with an operand of three digits or more."""
    for record in _records(folder / "test_large.jsonl"):
        steps = chains.chain_steps(record["chain"])
        operands = [float(x) for step in steps for x in step.expression.replace("*", " ").split() if x[0].isdigit()]
        assert max(operands) >= 100, record
    small = [float(r["result"]) for r in _records(folder / "test_small.jsonl")]
    assert max(small) <= 81


def test_bundled_files_are_deterministic(folder: Path, tmp_path: Path) -> None:
    again = bundled.write_bundled(tmp_path / "again")
    for name in ("train.jsonl", "test_small.jsonl", "test_large.jsonl"):
        assert (folder / name).read_bytes() == (again / name).read_bytes()


def test_trivial_policies_score_at_most_ten_percent(folder: Path) -> None:
    rows = baselines.trivial_scores(folder)
    assert {(r["heldout"], r["policy"]) for r in rows} == {
        (tier, policy)
        for tier in ("small", "large")
        for policy in ("constant", "most_frequent", "format_only", "first_number", "last_number")
    }
    assert all(r["metric"] == "accuracy" and r["n"] == 200 for r in rows)
    assert max(r["score"] for r in rows) <= 0.10, rows


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ("3 + 5", "5+3", True),
        ("3 * 5", "5 * 3.0", True),
        ("8 - 3", "3 - 8", False),
        ("8 / 2", "2 / 8", False),
        ("(2 + 3) * 4", "4 * (3 + 2)", True),
        ("1,200 / 4", "1200 / 4", True),
        ("3 + 5", "3 + 6", False),
    ],
)
def test_step_keys_name_the_operation_and_its_operands(a: str, b: str, same: bool) -> None:
    assert (chains.step_key(a) == chains.step_key(b)) is same


def test_overlap_counts_shared_chains_and_steps() -> None:
    def record(*steps: str) -> dict[str, str]:
        return {"chain": "".join(f'<gadget id="calculator">{s}</gadget>\n<output>0</output>\n' for s in steps)}

    train = [record("2 + 3", "5 * 4"), record("7 - 1")]
    heldout = [record("3 + 2", "4 * 5"), record("7 - 1", "6 / 2"), record("9 - 1"), {"chain": ""}]
    assert chains.overlap(train, heldout) == chains.Overlap(n=4, shared_chains=1, shared_steps=2)
    kept, dropped = chains.drop_overlap(train, heldout)
    assert dropped == 2 and kept == heldout[2:]


def test_loader_drops_held_out_problems_that_share_a_step(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    def write(name: str, rows: list[tuple[str, str, str]]) -> None:
        lines = []
        for i, (question, expression, result) in enumerate(rows):
            chain = f'<gadget id="calculator">{expression}</gadget>\n<output>{result}</output>'
            lines.append(json.dumps({"id": f"{name}-{i}", "question": question, "result": result, "chain": chain}))
        (tmp_path / name).write_text("\n".join(lines) + "\n")

    write("train.jsonl", [("Add 2 and 3.", "2 + 3", "5"), ("Take 1 from 7.", "7 - 1", "6")])
    write("test.jsonl", [("Add 3 and 2.", "3 + 2", "5"), ("Take 2 from 9.", "9 - 2", "7")])
    write("test_hard.jsonl", [("Multiply 123 by 45.", "123 * 45", "5535")])
    with caplog.at_level("WARNING"):
        _, tiers = data.load(tmp_path)
    assert {tier: [t["question"] for t in tasks] for tier, tasks in tiers.items()} == {
        "test": ["Take 2 from 9."],
        "hard": ["Multiply 123 by 45."],
    }
    assert "dropped 1 of 2 problems that share a calculation step with training" in caplog.text
    assert all(t["tier"] == tier for tier, tasks in tiers.items() for t in tasks)


def test_tier_names_come_from_file_names() -> None:
    assert data.tier_of(Path("test_large.jsonl")) == "large"
    assert data.tier_of(Path("data/test-00000-of-00001.parquet")) == "test"
    assert data.tier_of(Path("validation-00000-of-00001.parquet")) == "validation"
