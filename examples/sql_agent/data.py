"""Spider-format data for the SQL agent: the loader, the held-out sets and the prompt's worked examples.

The bundled mini-Spider (``bundled.py``) is written to disk in Spider's own layout, so the
bundled copy and a real Spider download go through the same loader::

    <folder>/train_spider.json       [{"db_id", "query", "query_toks", "query_toks_no_value",
    <folder>/dev.json                   "question", "question_toks"}, ...]
    <folder>/tables.json             [{"db_id", "table_names_original", "column_names_original",
                                        "column_types", "primary_keys", "foreign_keys", ...}, ...]
    <folder>/database/<db_id>/<db_id>.sqlite

``dev.json`` is split into two held-out sets by database (:func:`heldout_sets`): questions on
databases that also have training questions (``seen_dbs``) and on databases that have none
(``unseen_dbs``; all of Spider's dev set is of this kind). Every prompt's worked examples are
built from the schema alone (:func:`schema_examples`), never from a split's questions.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from bundled import write_bundled

SPIDER_URL = "https://yale-lily.github.io/spider"
BUNDLED_VERSION = "spider-mini-v2"
HELDOUT_KINDS = ("seen_dbs", "unseen_dbs")
HELDOUT_PER_SET = 0
"""Held-out questions per set that ``train.py`` evaluates by default, the first ones (0: all)."""
SPLITS = {"train": "train_spider.json", "dev": "dev.json"}
REQUIRED_FIELDS = ("db_id", "question", "query")


class SpiderDataError(ValueError):
    """The Spider folder is incomplete or a file in it is malformed; the message names the file."""


# -- loading (real Spider and the bundled copy alike) ------------------------------------------------


def _read_json_array(path: Path) -> list[Any]:
    if not path.is_file():
        raise SpiderDataError(
            f"{path}: file not found. Download Spider from {SPIDER_URL} and pass the unpacked folder "
            "(the one holding train_spider.json, dev.json, tables.json and database/) as --data, "
            "or leave --data out to use the bundled mini-Spider."
        )
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise SpiderDataError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}): {exc.msg}") from exc
    if not isinstance(rows, list):
        raise SpiderDataError(f"{path}: expected a JSON array of objects, got {type(rows).__name__}")
    return rows


def schema_text(table: dict[str, Any]) -> str:
    """One compact ``CREATE TABLE`` line per table from a ``tables.json`` entry."""
    names = table["table_names_original"]
    columns: list[list[str]] = [[] for _ in names]
    for (t_idx, col), typ in zip(table["column_names_original"], table["column_types"], strict=True):
        if t_idx >= 0:
            columns[t_idx].append(f"{col} {typ}")
    return "\n".join(f"CREATE TABLE {n} ({', '.join(cols)});" for n, cols in zip(names, columns, strict=True))


def load_tables(folder: Path) -> dict[str, dict[str, Any]]:
    """``tables.json`` by ``db_id``; a malformed entry names the file and its row index."""
    path = folder / "tables.json"
    out: dict[str, dict[str, Any]] = {}
    for i, row in enumerate(_read_json_array(path)):
        where = f"{path}, row {i}"
        if not isinstance(row, dict):
            raise SpiderDataError(f"{where}: expected an object, got {type(row).__name__}")
        for key in ("db_id", "table_names_original", "column_names_original", "column_types"):
            if key not in row:
                raise SpiderDataError(f"{where}: missing field {key!r}")
        if len(row["column_names_original"]) != len(row["column_types"]):
            raise SpiderDataError(f"{where}: column_names_original and column_types differ in length")
        try:
            row["schema"] = schema_text(row)
            row["examples"] = schema_examples(row)
        except (TypeError, ValueError, IndexError) as exc:
            raise SpiderDataError(f"{where}: malformed column list ({exc})") from exc
        out[row["db_id"]] = row
    return out


def load_split(folder: str | Path, split: str, *, prefix: str | None = None) -> list[dict[str, Any]]:
    """The tasks of ``split`` (``train`` or ``dev``) of a Spider folder, ready for the agent.

    Each task: ``task_id``, ``db_id``, ``question``, ``query`` (gold), ``db_path`` (absolute),
    ``schema`` (``CREATE TABLE`` lines from ``tables.json``) and ``examples`` (the worked
    question/query pairs of the prompt, built from the schema alone: :func:`schema_examples`).
    Errors name the file and row.
    """
    if split not in SPLITS:
        raise SpiderDataError(f"unknown split {split!r}; use one of {sorted(SPLITS)}")
    folder = Path(folder).expanduser().resolve()
    if not folder.is_dir():
        raise SpiderDataError(f"{folder}: no such folder. Download Spider from {SPIDER_URL} and pass its folder.")
    tables = load_tables(folder)
    path = folder / SPLITS[split]
    tasks = []
    for i, row in enumerate(_read_json_array(path)):
        where = f"{path}, row {i}"
        if not isinstance(row, dict):
            raise SpiderDataError(f"{where}: expected an object, got {type(row).__name__}")
        missing = [k for k in REQUIRED_FIELDS if not isinstance(row.get(k), str) or not row[k].strip()]
        if missing:
            raise SpiderDataError(f"{where}: missing or empty field(s) {', '.join(map(repr, missing))}")
        db_id = row["db_id"]
        if db_id not in tables:
            raise SpiderDataError(f"{where}: db_id {db_id!r} is not described in {folder / 'tables.json'}")
        db_path = folder / "database" / db_id / f"{db_id}.sqlite"
        if not db_path.is_file():
            raise SpiderDataError(f"{where}: database file {db_path} not found (db_id {db_id!r})")
        tasks.append(
            {
                "task_id": f"{prefix or split}-{i}",
                "db_id": db_id,
                "question": row["question"],
                "query": row["query"],
                "db_path": str(db_path),
                "schema": tables[db_id]["schema"],
                "examples": tables[db_id]["examples"],
            }
        )
    return tasks


def heldout_sets(folder: str | Path) -> dict[str, list[dict[str, Any]]]:
    """``dev.json`` split by database: ``seen_dbs`` (the database has training questions) and
    ``unseen_dbs`` (it has none). Task ids carry the set's name; an empty set is left out."""
    train_dbs = {t["db_id"] for t in load_split(folder, "train")}
    dev = load_split(folder, "dev")
    sets = {
        "seen_dbs": [t for t in dev if t["db_id"] in train_dbs],
        "unseen_dbs": [t for t in dev if t["db_id"] not in train_dbs],
    }
    for name, tasks in sets.items():
        for i, task in enumerate(tasks):
            task["task_id"] = f"{name}-{i}"
    return {name: tasks for name, tasks in sets.items() if tasks}


def schema_examples(table: dict[str, Any]) -> list[dict[str, str]]:
    """Three worked examples built from one table of a ``tables.json`` entry, for the prompt.

    The first table with a text column and a non-id number column: a count with ``>=``, a select
    with ``<=`` and a list sorted with ``ORDER BY`` (no ``LIMIT``). They show the SQL of the
    schema's own names without giving a question away: the bundled questions never use ``>=``,
    ``<=`` or an ``ORDER BY`` without ``LIMIT`` (a data test checks that no gold query has an
    example's masked form). ``[]`` when no table has both kinds of column.
    """
    names = table["table_names_original"]
    for t_idx, name in enumerate(names):
        cols = [
            (col, typ)
            for (i, col), typ in zip(table["column_names_original"], table["column_types"], strict=True)
            if i == t_idx
        ]
        text = [c for c, typ in cols if typ == "text"]
        nums = [c for c, typ in cols if typ == "number" and not c.lower().endswith("id")]
        if text and nums:
            label, num = text[0], nums[0]
            return [
                {
                    "question": f"How many {name} rows have {num} at least 10?",
                    "query": f"SELECT count(*) FROM {name} WHERE {num} >= 10",
                },
                {
                    "question": f"List the {label} of {name} rows with {num} at most 10.",
                    "query": f"SELECT {label} FROM {name} WHERE {num} <= 10",
                },
                {
                    "question": f"List the {label} of all {name} rows from the highest {num} to the lowest.",
                    "query": f"SELECT {label} FROM {name} ORDER BY {num} DESC",
                },
            ]
    return []


def default_cache_dir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "agentbolt" / "examples" / "sql_agent" / BUNDLED_VERSION


def ensure_bundled(folder: str | Path | None = None) -> Path:
    """The bundled mini-Spider folder, written on first use (atomically, safe across processes)."""
    target = Path(folder) if folder else default_cache_dir()
    if (target / "dev.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".spider-mini-", dir=target.parent))
    try:
        write_bundled(tmp)
        try:
            tmp.rename(target)
        except OSError:  # another process finished first
            if not (target / "dev.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def write_jsonl(tasks: list[dict[str, Any]], path: Path) -> None:
    """Tasks as JSON Lines of agentbolt ``Task`` objects (``task_id``, ``input``), e.g. for agentbolt-verl."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for task in tasks:
            f.write(json.dumps({"task_id": task["task_id"], "input": task}) + "\n")


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(description="Write the bundled mini-Spider (or check a Spider folder).")
    p.add_argument("--data", default=None, help="a Spider folder (default: the bundled copy, written on first use)")
    p.add_argument("--jsonl", default=None, help="also write train.jsonl and dev.jsonl of agentbolt tasks here")
    args = p.parse_args(argv)
    folder = Path(args.data) if args.data else ensure_bundled()
    train = load_split(folder, "train")
    print(
        f"train: {len(train)} questions on {len({t['db_id'] for t in train})} databases in {folder / SPLITS['train']}"
    )
    sets = heldout_sets(folder)
    for name, tasks in sets.items():
        print(f"{name}: {len(tasks)} held-out questions on {len({t['db_id'] for t in tasks})} databases")
    if args.jsonl:
        write_jsonl(train, Path(args.jsonl) / "train.jsonl")
        write_jsonl([t for tasks in sets.values() for t in tasks], Path(args.jsonl) / "dev.jsonl")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
