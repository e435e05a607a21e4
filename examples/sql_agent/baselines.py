"""Trivial policies on the SQL agent's held-out sets: what a score means only beside these.

Each policy answers every held-out question without reading it, and is scored with the
agent's own reward, :func:`agent.execution_accuracy` (result multisets compared):

- ``constant``: ``SELECT count(*) FROM <the schema's first table>``, the shortest query that
  runs on any schema;
- ``format_only``: the prompt's first worked example's query (well-formed, executes, answers
  another question);
- ``most_frequent``: a query returning the held-out set's own most frequent gold result (an
  upper bound for any policy that always gives the same result).

A rule-based solver reads the question (:func:`rule_sql`): a dozen regular expressions, one
per question template of the bundled data, with table and column names looked up in the schema
and join values in the database; it writes a query that returns the gold result for every
bundled held-out question, unseen databases included. What the bundled data measures is
therefore whether the model learns these templates and the schema lookup, not open-ended
text-to-SQL (a real Spider folder, ``--data``, measures that).

    uv run python examples/sql_agent/baselines.py [--data SPIDER_DIR]
"""

from __future__ import annotations

import re
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


BUNDLED_DATA_MEASURES = (
    "The bundled questions come from a dozen templates per database: a regular-expression parser "
    "that looks names up in the schema writes a correct query for every held-out question, unseen "
    "databases too, so the bundled sets measure whether the model learns those templates and the "
    "schema lookup, not open-ended text-to-SQL."
)
"""One sentence on what the bundled held-out sets measure (printed with the figures)."""

_AGG_WORDS = {"average": "avg", "maximum": "max", "minimum": "min", "total": "sum"}


def _tables(schema: str) -> dict[str, list[str]]:
    """Table -> column names, from the ``CREATE TABLE`` lines of a task's schema."""
    return {
        m.group(1): [c.strip().split()[0] for c in m.group(2).split(",")]
        for m in re.finditer(r"CREATE TABLE (\w+) \(([^)]*)\)", schema)
    }


def _singular(word: str) -> str:
    return word[:-3] + "y" if word.endswith("ies") else word[:-1] if word.endswith("s") else word


def rule_sql(task: dict[str, Any]) -> str | None:
    """The rule-based solver: a query for the question from its template, or ``None``."""
    tables = _tables(task["schema"])
    q = task["question"]

    def table(word: str) -> str | None:
        return next((t for t in tables if t in (word, _singular(word))), None)

    def lit(value: str) -> str:
        return value if re.fullmatch(r"-?\d+(?:\.\d+)?", value) else "'" + value.replace("'", "''") + "'"

    patterns: list[tuple[str, Any]] = [
        (r"How many (\w+) are there\?", lambda t: f"SELECT count(*) FROM {table(t)}"),
        (
            r"What is the (average|maximum|minimum|total) (\w+) of all (\w+)\?",
            lambda a, c, t: f"SELECT {_AGG_WORDS[a]}({c}) FROM {table(t)}",
        ),
        (
            r"What is the (\w+) of the (\w+) with the (highest|lowest) (\w+)\?",
            lambda lab, t, w, c: (
                f"SELECT {lab} FROM {table(t)} ORDER BY {c} {'DESC' if w == 'highest' else 'ASC'} LIMIT 1"
            ),
        ),
        (
            r"What is the (\w+) of the (\w+) whose (\w+) is (.+)\?",
            lambda c, t, lab, v: f"SELECT {c} FROM {table(t)} WHERE {lab} = {lit(v)}",
        ),
        (
            r"How many (\w+) have an? (\w+) (greater|less) than (\S+)\?",
            lambda t, c, w, n: f"SELECT count(*) FROM {table(t)} WHERE {c} {'>' if w == 'greater' else '<'} {n}",
        ),
        (
            r"List the (\w+) of (\w+) with an? (\w+) (greater|less) than (\S+)\.",
            lambda lab, t, c, w, n: (
                f"SELECT {_singular(lab)} FROM {table(t)} WHERE {c} {'>' if w == 'greater' else '<'} {n}"
            ),
        ),
        (
            r"How many (\w+) have the (\w+) (.+)\?",
            lambda t, c, v: f"SELECT count(*) FROM {table(t)} WHERE {c} = {lit(v)}",
        ),
        (
            r"List the (\w+) of (\w+) whose (\w+) is (.+)\.",
            lambda lab, t, c, v: f"SELECT {_singular(lab)} FROM {table(t)} WHERE {c} = {lit(v)}",
        ),
    ]
    for pattern, build in patterns:
        m = re.fullmatch(pattern, q)
        if m:
            query = build(*m.groups())
            if "FROM None" not in query:  # a table the schema does not have: not this template
                return query
    # the join templates: a value of a parent table's name column in the question
    for parent in tables:
        for child, columns in tables.items():
            if f"{parent}_id" not in columns:
                continue
            names = [str(r[0]) for r in run_query(task["db_path"], f"SELECT name FROM {parent}")]
            for v in sorted(names, key=len, reverse=True):
                if v not in q:
                    continue
                on = f"FROM {child} AS T1 JOIN {parent} AS T2 ON T1.{parent}_id = T2.id WHERE T2.name = {lit(v)}"
                m = re.match(r"List the (\w+) of ", q)
                return f"SELECT T1.{_singular(m.group(1))} {on}" if m else f"SELECT count(*) {on}"
    return None


def rule_scores(data_dir: Path | None = None, per_set: int = HELDOUT_PER_SET) -> list[dict[str, Any]]:
    """The rule-based solver's rows on the same questions as :func:`trivial_scores` (same keys)."""
    folder = Path(data_dir) if data_dir else ensure_bundled()
    rows = []
    for name, every in heldout_sets(folder).items():
        tasks = every[: per_set or None]
        scores = [execution_accuracy(t["db_path"], rule_sql(t) or "SELECT 1", t["query"]) for t in tasks]
        rows.append(
            {
                "heldout": name,
                "policy": "template_rules",
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
    for row in rule_scores(args.data, args.val):
        print(f"{row['heldout']:<12} {row['policy']:<15} {row['metric']} {row['score']:.3f} (n={row['n']}, rule)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
