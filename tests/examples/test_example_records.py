"""Published figures come from committed run records, and the READMEs say what the records say.

Every ``docs/runs/<example>/`` holds a valid :class:`agentbolt.runs.evaluation.RunRecord` and the
run's metrics; every README block between ``<!-- figures:... -->`` markers equals what
``benchmarks/examples.py --report`` generates from the records (and the trivial policies), so a
figure edited by hand, or a record replaced without regenerating the READMEs, fails here.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from agentbolt.runs.evaluation import RunRecord

REPO = Path(__file__).resolve().parents[2]
RUNS = REPO / "docs" / "runs"
RECORDS = sorted(p.parent.name for p in RUNS.glob("*/result.json"))
VARIANTS = sorted(str(p.parent.relative_to(RUNS)) for p in RUNS.glob("*/variants/*/result.json"))


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


bench = _load(REPO / "benchmarks/examples.py", "benchmarks_examples_for_records")


def test_the_published_runs_are_there() -> None:
    # the examples whose figures the READMEs publish; the others' READMEs say "no published run yet"
    assert {"sql_agent", "calc_agent", "rag_agent"} <= set(RECORDS)


@pytest.mark.parametrize("where", RECORDS + VARIANTS)
def test_a_record_is_complete(where: str) -> None:
    record = RunRecord.load(RUNS / where / "result.json")
    name = where.split("/")[0]
    assert record.example == name
    assert f"python examples/{name}/train.py" in record.command, record.command
    assert len(record.commit.removesuffix("+dirty")) == 40 and record.steps > 0
    lines = (RUNS / where / "metrics.jsonl").read_text().splitlines()
    steps = {json.loads(line)["step"] for line in lines if line.strip()}
    assert set(range(1, record.steps + 1)) <= steps  # every trained step's metrics are there
    for score in record.heldout.values():
        assert 0.0 <= score.before <= 1.0 and 0.0 <= score.after <= 1.0 and score.n > 0


def _points_under_a_legend(fig: Any) -> list[tuple[str, float, float]]:
    """Every plotted data point that a legend of its axes covers, once the figure is drawn."""
    fig.canvas.draw()
    hidden = []
    for ax in fig.axes:
        legend = ax.get_legend()
        if legend is not None:
            box = legend.get_window_extent()
            hidden += [
                (ax.get_title(), float(x), float(y))
                for line in ax.get_lines()
                for x, y in line.get_xydata()
                if box.contains(*ax.transData.transform((x, y)))
            ]
    return hidden


@pytest.mark.parametrize("where", RECORDS + VARIANTS)
def test_a_published_curve_hides_no_point_and_shows_se_and_n(where: str) -> None:
    """The curve.png of a record (benchmarks/examples.py draws it on --publish): no legend covers a
    point, training steps are whole ticks, every held-out set has ± 1 se bars and its n."""
    record = RunRecord.load(RUNS / where / "result.json")
    fig = bench.record_figure(record, RUNS / where / "metrics.jsonl")
    assert _points_under_a_legend(fig) == []
    reward_axes, heldout_axes = fig.axes
    assert all(float(tick).is_integer() for tick in reward_axes.get_xticks())
    assert len(heldout_axes.containers) == len(record.heldout) and all(c.has_yerr for c in heldout_axes.containers)
    labels = [text.get_text() for text in heldout_axes.get_legend().get_texts()]
    assert labels == [f"{name.replace('_', ' ')} (n={s.n})" for name, s in record.heldout.items()]
    assert heldout_axes.get_title().startswith("held-out ")


def test_the_readmes_show_what_the_records_say(tmp_path: Path) -> None:
    updates = bench.readme_updates(env={"XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert REPO / "README.md" in updates
    stale = [str(path.relative_to(REPO)) for path, text in updates.items() if path.read_text(encoding="utf-8") != text]
    assert not stale, f"README figures differ from docs/runs/: {stale}; run `benchmarks/examples.py --report`"
    for name in ("sql_agent", "rag_agent", "calc_agent"):  # each example README carries its generated block
        assert REPO / "examples" / name / "README.md" in updates


def test_a_changed_figure_is_caught() -> None:
    """The block of a record whose figure changed differs from the README: the check can fail."""
    name = "sql_agent"
    record = RunRecord.load(RUNS / name / "result.json")
    readme = (REPO / "examples" / name / "README.md").read_text(encoding="utf-8")
    first = next(iter(record.heldout))
    changed = record.model_copy(
        update={"heldout": {**record.heldout, first: record.heldout[first].model_copy(update={"after": 0.999})}}
    )
    block = bench.example_block(name, changed, [])
    assert bench.replace_block(readme, name, block) != readme
    with pytest.raises(LookupError, match="no '<!-- figures:nope -->'"):
        bench.replace_block(readme, "nope", "x")


def test_stage_notes_and_best_trivial_policy() -> None:
    notes = bench.stage_notes(
        {"before": {"score": 0.1, "se": 0.03, "f1": 0.2, "f1_se": 0.04}, "after": {"score": 0.3, "se": 0.04, "f1": 0.4}}
    )
    assert notes == "F1 0.200 ± 0.040 → 0.400"
    chain = bench.stage_notes(
        {"base": {"score": 0.2, "tool_call_rate": 0.0}, "sft": {"score": 0.5, "tool_call_rate": 0.9}}
    )
    assert chain == "base 0.200 (tool calls 0.00) → sft 0.500 (tool calls 0.90)"
    timed = bench.stage_notes(
        {
            "step 0": {"score": 0.35, "se": 0.05, "training_s": 0.0},
            "step 10": {"score": 0.53, "se": 0.05, "gain_z": 2.54, "training_s": 221.4},
        }
    )
    assert timed == "step 0 0.350 ± 0.050 (0 s of training) → step 10 0.530 ± 0.050 (+2.5 se, 221 s of training)"
    rows = [
        {"heldout": "dev", "policy": "constant", "metric": "f1", "score": 0.02, "n": 10},
        {"heldout": "dev", "policy": "most_frequent", "metric": "f1", "score": 0.05, "n": 10},
        {"heldout": "dev", "policy": "most_frequent", "metric": "exact_match", "score": 0.09, "n": 10},
    ]
    assert bench.best_trivial(rows, "dev", "f1", 10) == "0.050 (most_frequent)"
    assert (
        bench.best_trivial(rows, "dev", "f1", 60)
        == bench.best_trivial(rows, "dev", "f1")
        == "0.050 (most_frequent, n = 10)"
    )
    assert bench.best_trivial(rows, "test", "f1") == "n/a"


def test_examples_table_without_and_with_a_staged_record() -> None:
    """calc_agent without a record: a "no published run yet" row per held-out tier, its trivial
    policies beside; with a record whose tiers have base/sft/rl stages: each stage's score ± se and
    tool-call rate; a record's other metrics (F1) get their best trivial policy beside too."""
    trivial = {
        "calc_agent": [
            {"heldout": "small", "policy": "constant", "metric": "accuracy", "score": 0.02, "n": 50},
            {"heldout": "large", "policy": "constant", "metric": "accuracy", "score": 0.0, "n": 50},
        ],
        "rag_agent": [
            {"heldout": "dev", "policy": "constant", "metric": "exact_match", "score": 0.0, "n": 9},
            {"heldout": "dev", "policy": "generic_word", "metric": "f1", "score": 0.03, "n": 9},
        ],
    }
    rag = RunRecord.model_validate(
        {
            "example": "rag_agent",
            "command": "python examples/rag_agent/train.py",
            "commit": "2" * 40,
            "date": "2026-11-26",
            "machine": "m",
            "model": "x",
            "steps": 2,
            "wall_s": 120.0,
            "s_per_step": 60.0,
            "heldout": {
                "dev": {
                    "metric": "exact_match",
                    "n": 9,
                    "before": 0.1,
                    "before_se": 0.1,
                    "after": 0.3,
                    "after_se": 0.15,
                    "stages": {
                        "before": {"score": 0.1, "se": 0.1, "f1": 0.2},
                        "after": {"score": 0.3, "se": 0.15, "f1": 0.4},
                    },
                }
            },
            "headline": "dev/exact_match",
        }
    )
    table = bench.examples_table(["rag_agent"], {"rag_agent": rag}, trivial)
    calc_rows = [line for line in table.splitlines() if "calc_agent" in line]
    assert [row.split(" | ")[1] for row in calc_rows] == ["small", "large"]
    assert all("no published run yet (`docs/runs/calc_agent/result.json`)" in row for row in calc_rows)
    assert "0.020 (constant, n = 50)" in calc_rows[0]
    assert not any("sql_agent" in line and "no published" not in line for line in table.splitlines())
    rag_row = next(line for line in table.splitlines() if "rag_agent" in line)
    assert "0.100 ± 0.100 → 0.300 ± 0.150" in rag_row and "(n = 9)" in rag_row
    assert "F1 0.200 → 0.400" in rag_row and "0.000 (constant); F1 0.030 (generic_word)" in rag_row

    calc = rag.model_copy(
        update={
            "example": "calc_agent",
            "headline": "small/accuracy",
            "heldout": {
                "small": rag.heldout["dev"].model_copy(
                    update={
                        "metric": "accuracy",
                        "n": 50,
                        "stages": {
                            "base": {"score": 0.1, "se": 0.04, "tool_call_rate": 0.0},
                            "sft": {"score": 0.2, "se": 0.05, "tool_call_rate": 0.9},
                            "rl": {"score": 0.3, "se": 0.06, "tool_call_rate": 0.96},
                        },
                    }
                )
            },
        }
    )
    table = bench.examples_table([], {"calc_agent": calc}, trivial)
    calc_rows = [line for line in table.splitlines() if "calc_agent" in line]
    assert len(calc_rows) == 1 and "**small**" in calc_rows[0] and "accuracy (n = 50)" in calc_rows[0]
    assert (
        "base 0.100 ± 0.040 (tool calls 0.00) → sft 0.200 ± 0.050 (tool calls 0.90) → rl 0.300 ± 0.060 (tool calls 0.96)"
        in calc_rows[0]
    )
    assert next(line for line in table.splitlines() if "sql_agent" in line).count("no published run yet") == 1


def test_publish_copies_a_valid_record_and_refuses_others(tmp_path: Path) -> None:
    source = tmp_path / "run"
    source.mkdir()
    record = {
        "example": "demo",
        "command": "python examples/demo/train.py",
        "commit": "0" * 40,
        "date": "2026-11-26",
        "machine": "2 vCPU, AVX-512, no GPU",
        "model": "m",
        "steps": 1,
        "wall_s": 1.0,
        "s_per_step": 1.0,
        "heldout": {
            "dev": {"metric": "accuracy", "n": 2, "before": 0.0, "before_se": 0.0, "after": 0.5, "after_se": 0.35}
        },
        "headline": "dev/accuracy",
    }
    (source / "result.json").write_text(json.dumps(record))
    (source / "metrics.jsonl").write_text('{"step": 1, "train/reward": 0.5}\n')
    target = bench.publish("demo", source, runs=tmp_path / "docs")
    assert sorted(p.name for p in target.iterdir()) == ["curve.png", "metrics.jsonl", "result.json"]
    with pytest.raises(ValueError, match="is a record of 'demo', not 'other'"):
        bench.publish("other", source, runs=tmp_path / "docs")
    (source / "metrics.jsonl").write_text("x" * (bench.MAX_METRICS_BYTES + 1))
    with pytest.raises(ValueError, match="trim it first"):
        bench.publish("demo", source, runs=tmp_path / "docs")
    (source / "result.json").write_text(json.dumps({**record, "headline": "dev/f1"}))
    with pytest.raises(ValueError, match="headline"):
        bench.publish("demo", source, runs=tmp_path / "docs")
