"""No trivial policy scores above 0.10 on any bundled held-out set of any example.

Every example with an ``examples/<name>/baselines.py`` is checked (``trivial_scores()`` run in a
process of its own, as ``benchmarks/examples.py`` runs it): a constant answer, the most frequent
answer, format-only, and the example's own shortcuts (the generic-word rule for RAG, the most
frequent result for SQL) -- so no future data change can make a headline metric winnable without
the task. The check itself can fail: on data with "X University" answers, the generic-word rule
scores F1 0.649 (the issue that led to it).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


bench = _load(REPO / "benchmarks/examples.py", "benchmarks_examples_under_test")
rag_data = _load(REPO / "examples/rag_agent/data.py", "rag_agent_data_for_trivial_policies")

LIMIT = 0.10
EXAMPLES = sorted(p.parent.name for p in (REPO / "examples").glob("*/baselines.py"))


def test_the_examples_with_baselines_are_found() -> None:
    assert {"quickstart", "rag_agent", "sql_agent", "openenv_env", "verifiers_env"} <= set(EXAMPLES)


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_trivial_policy_scores_at_most_a_tenth(name: str, tmp_path: Path) -> None:
    rows = bench.trivial_scores(name, env={"XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert rows, f"{name}: baselines.py returned no rows"
    for row in rows:
        assert set(row) == {"heldout", "policy", "metric", "score", "n"}, row
        assert isinstance(row["score"], float) and isinstance(row["n"], int) and row["n"] > 0, row
    too_high = [r for r in rows if r["score"] > LIMIT]
    assert not too_high, f"{name}: trivial policies above {LIMIT}: {json.dumps(too_high, indent=1)}"
    # every held-out set is covered by at least a constant and a most-frequent policy
    for heldout in {r["heldout"] for r in rows}:
        assert {"constant", "most_frequent"} <= {r["policy"] for r in rows if r["heldout"] == heldout}


def test_the_check_fails_on_data_a_generic_word_can_win(tmp_path: Path) -> None:
    """Answers of the form "X University"/"X City": the generic-word rule scores far above the limit."""
    good = rag_data.write_bundled(tmp_path / "good")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / rag_data.TRAIN_FILE).write_text((good / rag_data.TRAIN_FILE).read_text())
    rewritten = []
    for line in (good / rag_data.DEV_FILE).read_text().splitlines():
        q = json.loads(line)
        q["answer"] += " University" if "university" in q["question"].lower() else " City"
        rewritten.append(json.dumps(q))
    (bad / rag_data.DEV_FILE).write_text("\n".join(rewritten) + "\n")
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    scores = {(r["policy"], r["metric"]): r["score"] for r in bench.trivial_scores("rag_agent", env=env, data_dir=bad)}
    assert scores[("generic_word", "f1")] > 0.6 and scores[("generic_word", "exact_match")] == 0.0
    scores = {(r["policy"], r["metric"]): r["score"] for r in bench.trivial_scores("rag_agent", env=env, data_dir=good)}
    assert scores[("generic_word", "f1")] == 0.0
