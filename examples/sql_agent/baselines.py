"""Trivial policies on the SQL agent's held-out sets: what a score means only beside these.

Each policy answers every held-out question without reading it, and is scored with the
agent's own reward, :func:`agent.execution_accuracy` (result multisets compared):

- ``constant``: ``SELECT count(*) FROM <the schema's first table>``, the shortest query that
  runs on any schema;
- ``format_only``: the prompt's first worked example's query (well-formed, executes, answers
  another question);
- ``most_frequent``: a query returning the held-out set's own most frequent gold result (an
  upper bound for any policy that always gives the same result).

    uv run python examples/sql_agent/baselines.py [--data SPIDER_DIR]
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from agent import execution_accuracy, run_query  # noqa: E402
from data import HELDOUT_PER_SET, ensure_bundled, heldout_sets  # noqa: E402

METRIC = "execution_accuracy"


def _literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, int | float):
        return repr(value)
    return "'" + str(value).replace("'", "''") + "'"


def values_query(rows: list[tuple[Any, ...]]) -> str:
    """A query whose result is exactly ``rows`` (as a multiset), from literals only."""
    if not rows:
        return "SELECT 1 WHERE 0"
    return " UNION ALL ".join("SELECT " + ", ".join(_literal(v) for v in row) for row in rows)


def _first_table(task: dict[str, Any]) -> str:
    return task["schema"].split("CREATE TABLE ", 1)[1].split(" ", 1)[0]


def _most_frequent_result(tasks: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    results = Counter(tuple(sorted(run_query(t["db_path"], t["query"]), key=repr)) for t in tasks)
    return list(results.most_common(1)[0][0])


def trivial_scores(data_dir: Path | None = None, per_set: int = HELDOUT_PER_SET) -> list[dict[str, Any]]:
    """One row per (held-out set, policy): ``heldout``, ``policy``, ``metric``, ``score``, ``n``.

    On the questions ``train.py`` evaluates by default, the first ``per_set`` of each set (0: all).
    """
    folder = Path(data_dir) if data_dir else ensure_bundled()
    rows = []
    for name, every in heldout_sets(folder).items():
        tasks = every[: per_set or None]
        frequent = values_query(_most_frequent_result(tasks))
        policies = {
            "constant": lambda t: f"SELECT count(*) FROM {_first_table(t)}",
            "format_only": lambda t: t["examples"][0]["query"] if t["examples"] else "SELECT 1",
            "most_frequent": lambda t, q=frequent: q,
        }
        for policy, answer in policies.items():
            scores = [execution_accuracy(t["db_path"], answer(t), t["query"]) for t in tasks]
            rows.append(
                {
                    "heldout": name,
                    "policy": policy,
                    "metric": METRIC,
                    "score": sum(scores) / len(scores),
                    "n": len(tasks),
                }
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=None, help="a Spider folder (default: the bundled mini-Spider)")
    p.add_argument("--val", type=int, default=HELDOUT_PER_SET, help="questions per held-out set, as train.py's --val")
    args = p.parse_args(argv)
    for row in trivial_scores(args.data, args.val):
        print(f"{row['heldout']:<12} {row['policy']:<15} {row['metric']} {row['score']:.3f} (n={row['n']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
