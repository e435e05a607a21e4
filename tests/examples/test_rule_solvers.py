"""Every example's rule-based solvers (``rule_scores()`` of its ``baselines.py``), computed in CI.

Unlike the trivial policies (``test_trivial_policies.py``: at most 0.10), a rule reads the
question, and on templated data it may solve everything: no ceiling applies. What must hold is
that the rules are scored like the trivial policies (same held-out sets, same questions, the
example's own scoring), that the strongest rule beats every policy that ignores the question,
and that the sentence on what the bundled data measures is there to print beside them.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_examples_for_rules", REPO / "benchmarks" / "examples.py")
assert _spec is not None and _spec.loader is not None
bench = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = bench
_spec.loader.exec_module(bench)

EXAMPLES = sorted(p.parent.name for p in (REPO / "examples").glob("*/baselines.py"))


def test_every_example_with_trivial_policies_has_rule_solvers() -> None:
    assert set(EXAMPLES) >= {"quickstart", "sql_agent", "rag_agent", "calc_agent", "openenv_env", "verifiers_env"}


@pytest.mark.parametrize("name", EXAMPLES)
def test_rules_are_scored_like_the_trivial_policies_and_beat_them(name: str, tmp_path: Path) -> None:
    got = bench.baselines(name, env={"XDG_CACHE_HOME": str(tmp_path / "cache")})
    trivial, rules = got["trivial"], got["rules"]
    assert rules, f"{name}: baselines.py has no rule_scores() rows"
    assert isinstance(got["measures"], str) and got["measures"].endswith("."), got["measures"]
    keys = {(r["heldout"], r["metric"], r["n"]) for r in trivial}
    assert {(r["heldout"], r["metric"], r["n"]) for r in rules} == keys  # same sets, metrics, questions
    assert all(0.0 <= r["score"] <= 1.0 for r in rules)
    assert not {r["policy"] for r in rules} & {r["policy"] for r in trivial}
    for heldout, metric, _ in keys:
        best_rule = max(r["score"] for r in rules if (r["heldout"], r["metric"]) == (heldout, metric))
        best_trivial = max(r["score"] for r in trivial if (r["heldout"], r["metric"]) == (heldout, metric))
        assert best_rule > best_trivial, (name, heldout, metric, best_rule, best_trivial)


def test_the_report_prints_the_rules_beside_before_and_after() -> None:
    rows = [{"heldout": "dev", "policy": "p", "metric": "exact_match", "score": 0.05, "n": 10}]
    rules = [{"heldout": "dev", "policy": "bm25_top2_regex", "metric": "exact_match", "score": 0.9, "n": 10}]
    block = bench.example_block("rag_agent", None, rows, rules, "Two templates.")
    assert "| dev | bm25_top2_regex | exact match | 0.900 | 10 |" in block
    assert block.endswith("What the bundled data measures: Two templates.")
