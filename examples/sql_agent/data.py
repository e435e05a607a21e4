"""Spider-format data for the SQL agent: a bundled mini-Spider, generated in code, and the loader.

The bundled set is written to disk in Spider's own layout, so the bundled copy and a real Spider
download go through the same loader::

    <folder>/train_spider.json       [{"db_id", "query", "query_toks", "query_toks_no_value",
    <folder>/dev.json                   "question", "question_toks"}, ...]
    <folder>/tables.json             [{"db_id", "table_names_original", "column_names_original",
                                        "column_types", "primary_keys", "foreign_keys", ...}, ...]
    <folder>/database/<db_id>/<db_id>.sqlite

The bundled set (:func:`ensure_bundled`) has four small databases (two tables each, 8-14 rows
per table) and templated questions: counts, filters, aggregates, "the one with the highest",
and one-join questions. The held-out questions (``dev.json``) are on the SAME databases as the
training questions but are different questions (no gold query appears in both): what training
can teach a 135M model here is the schemas and the query patterns, not the answers.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import sqlite3
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SPIDER_URL = "https://yale-lily.github.io/spider"
BUNDLED_VERSION = "spider-mini-v1"
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
        except (TypeError, ValueError, IndexError) as exc:
            raise SpiderDataError(f"{where}: malformed column list ({exc})") from exc
        out[row["db_id"]] = row
    return out


def load_split(
    folder: str | Path, split: str, *, prefix: str | None = None, with_examples: bool = True
) -> list[dict[str, Any]]:
    """The tasks of ``split`` (``train`` or ``dev``) of a Spider folder, ready for the agent.

    Each task: ``task_id``, ``db_id``, ``question``, ``query`` (gold), ``db_path`` (absolute) and
    ``schema`` (``CREATE TABLE`` lines from ``tables.json``) and ``examples`` (up to three worked
    question/query pairs on the same database from the training split, see
    :func:`example_pairs`; held-out questions never appear there). Errors name the file and row.
    """
    if split not in SPLITS:
        raise SpiderDataError(f"unknown split {split!r}; use one of {sorted(SPLITS)}")
    folder = Path(folder).expanduser().resolve()
    if not folder.is_dir():
        raise SpiderDataError(f"{folder}: no such folder. Download Spider from {SPIDER_URL} and pass its folder.")
    tables = load_tables(folder)
    path = folder / SPLITS[split]
    shots = example_pairs(folder, tables) if with_examples else {}
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
        if any(row["question"] == e["question"] for e in shots.get(db_id, ())):
            continue  # a worked example of the prompt: not a task
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
                "examples": shots.get(db_id, []),
            }
        )
    return tasks


def _pairs_of(path: Path) -> list[tuple[str, str, str]]:
    """(db_id, question, query) of a split file, unchecked (the loader checks the rows it returns)."""
    rows = _read_json_array(path)
    return [
        (r["db_id"], r["question"], r["query"])
        for r in rows
        if isinstance(r, dict) and all(isinstance(r.get(k), str) for k in REQUIRED_FIELDS)
    ]


def example_pairs(folder: Path, tables: dict[str, dict[str, Any]]) -> dict[str, list[dict[str, str]]]:
    """Up to three worked examples per database from the TRAINING split: a filtered count, a
    filtered select and an ``ORDER BY`` query.

    The shortest such pairs, so the prompt stays short. Databases with no training questions
    (Spider's dev databases are not in its train set) get none; the agent then uses generic
    examples built from the schema.
    """
    by_db: dict[str, list[tuple[str, str]]] = {}
    for db_id, question, query in _pairs_of(folder / SPLITS["train"]):
        if db_id in tables:
            by_db.setdefault(db_id, []).append((question, query))
    out = {}
    for db_id, pairs in by_db.items():
        pairs = sorted(set(pairs), key=lambda qq: (len(qq[1]), qq))
        count = [p for p in pairs if " WHERE " in p[1] and "count(" in p[1].lower()]
        select = [p for p in pairs if " WHERE " in p[1] and "count(" not in p[1].lower() and " JOIN " not in p[1]]
        ordered = [p for p in pairs if " ORDER BY " in p[1] and " JOIN " not in p[1]]
        chosen = list(dict.fromkeys([*(count[:1] or pairs[:1]), *(select[:1] or pairs[1:2]), *ordered[:1]]))
        out[db_id] = [{"question": q, "query": s} for q, s in chosen]
    return out


# -- the bundled mini-Spider ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Table:
    name: str
    singular: str
    label: str  # the name-like column the questions ask for
    columns: tuple[tuple[str, str], ...]  # (name, spider type) without the id
    numeric: tuple[tuple[str, str], ...]  # (column, words) for numeric filters and aggregates
    categorical: tuple[str, ...]  # columns for equality filters


@dataclass(frozen=True)
class _Db:
    db_id: str
    parent: _Table
    child: _Table
    fk: str  # child column referencing parent.id
    join_phrase: str  # "{child} ... {parent value}", e.g. "employees in the {v} department"
    join_count_phrase: str


_DBS = (
    _Db(
        "company",
        _Table("department", "department", "name", (("name", "text"), ("city", "text")), (), ("city",)),
        _Table(
            "employee",
            "employee",
            "name",
            (("name", "text"), ("department_id", "number"), ("salary", "number"), ("age", "number")),
            (("salary", "salary"), ("age", "age")),
            (),
        ),
        "department_id",
        "List the names of employees in the {v} department.",
        "How many employees work in the {v} department?",
    ),
    _Db(
        "school",
        _Table("teacher", "teacher", "name", (("name", "text"), ("subject", "text")), (), ("subject",)),
        _Table(
            "student",
            "student",
            "name",
            (("name", "text"), ("teacher_id", "number"), ("grade", "number"), ("age", "number")),
            (("grade", "grade"), ("age", "age")),
            (),
        ),
        "teacher_id",
        "List the names of students taught by {v}.",
        "How many students are taught by {v}?",
    ),
    _Db(
        "shop",
        _Table("supplier", "supplier", "name", (("name", "text"), ("country", "text")), (), ("country",)),
        _Table(
            "product",
            "product",
            "name",
            (
                ("name", "text"),
                ("supplier_id", "number"),
                ("price", "number"),
                ("stock", "number"),
                ("category", "text"),
            ),
            (("price", "price"), ("stock", "stock")),
            ("category",),
        ),
        "supplier_id",
        "List the names of products supplied by {v}.",
        "How many products are supplied by {v}?",
    ),
    _Db(
        "library",
        _Table("author", "author", "name", (("name", "text"), ("country", "text")), (), ("country",)),
        _Table(
            "book",
            "book",
            "title",
            (("title", "text"), ("author_id", "number"), ("year", "number"), ("pages", "number"), ("genre", "text")),
            (("year", "year"), ("pages", "pages")),
            ("genre",),
        ),
        "author_id",
        "List the titles of books written by {v}.",
        "How many books were written by {v}?",
    ),
)

_NAMES = [
    "Alice",
    "Bruno",
    "Chen",
    "Dana",
    "Emil",
    "Fatima",
    "Goran",
    "Hana",
    "Ivan",
    "Jonas",
    "Kemal",
    "Lena",
    "Mira",
    "Nils",
    "Omar",
    "Paula",
    "Quinn",
    "Rosa",
    "Sven",
    "Tara",
    "Umar",
    "Vera",
    "Wim",
    "Yara",
]
_VALUES = {
    ("department", "name"): ["Sales", "Research", "Finance", "Support"],
    ("department", "city"): ["Berlin", "Paris", "Berlin", "Madrid"],
    ("teacher", "name"): ["Mr Smith", "Ms Jones", "Mr Brown", "Ms Green"],
    ("teacher", "subject"): ["Math", "History", "Math", "Biology"],
    ("supplier", "name"): ["Acme", "Globex", "Initech", "Umbrella"],
    ("supplier", "country"): ["France", "Japan", "France", "Brazil"],
    ("author", "name"): ["Ada Lee", "Ben Okri", "Cora Diaz", "Dan Brown"],
    ("author", "country"): ["Canada", "Nigeria", "Canada", "Mexico"],
    ("product", "name"): [
        "Lamp",
        "Chair",
        "Desk",
        "Mug",
        "Kettle",
        "Pillow",
        "Rug",
        "Clock",
        "Vase",
        "Shelf",
        "Stool",
        "Fan",
    ],
    ("product", "category"): ["Home", "Office", "Kitchen"],
    ("book", "title"): [
        "Blue River",
        "Night Train",
        "Old Maps",
        "Cold Stars",
        "Red Sand",
        "Glass Town",
        "Quiet Sea",
        "Iron Gate",
        "Lost Keys",
        "Tall Grass",
        "Paper Moon",
        "Silent Hill",
    ],
    ("book", "genre"): ["Crime", "Fantasy", "History"],
}
_NUMERIC_RANGES = {
    "salary": (30, 99, 1000),
    "age": (18, 65, 1),
    "grade": (50, 100, 1),
    "price": (3, 90, 1),
    "stock": (1, 60, 1),
    "year": (1950, 2023, 1),
    "pages": (100, 900, 1),
}
_THRESHOLDS = {
    "salary": [40000, 50000, 60000, 70000, 80000],
    "age": [25, 30, 40, 50],
    "grade": [60, 70, 80, 90],
    "price": [10, 20, 40, 60],
    "stock": [10, 20, 30, 40],
    "year": [1970, 1990, 2000, 2010],
    "pages": [200, 300, 500, 700],
}
_AGGS = (("avg", "average"), ("max", "maximum"), ("min", "minimum"), ("sum", "total"))


def _rows(db: _Db, rng: random.Random) -> dict[str, list[tuple[Any, ...]]]:
    parent_rows = [(i + 1, *(_VALUES[(db.parent.name, c)][i] for c, _ in db.parent.columns)) for i in range(4)]
    n = rng.randint(10, 12)
    labels = _VALUES.get((db.child.name, db.child.label)) or rng.sample(_NAMES, n)
    numbers = {}
    for col, _ in db.child.numeric:
        lo, hi, scale = _NUMERIC_RANGES[col]
        numbers[col] = [v * scale for v in rng.sample(range(lo, hi + 1), n)]  # distinct: no ties at the top
    child_rows = []
    for i in range(n):
        row: list[Any] = [i + 1]
        for col, _ in db.child.columns:
            if col == db.child.label:
                row.append(labels[i])
            elif col == db.fk:
                row.append(1 + (i % 3) if i < 9 else rng.randint(1, 3))  # parent 4 has no children
            elif col in numbers:
                row.append(numbers[col][i])
            else:
                row.append(rng.choice(_VALUES[(db.child.name, col)]))
        child_rows.append(tuple(row))
    return {db.parent.name: parent_rows, db.child.name: child_rows}


def _write_db(path: Path, db: _Db, rows: dict[str, list[tuple[Any, ...]]]) -> None:
    con = sqlite3.connect(path)
    try:
        for table in (db.parent, db.child):
            cols = ", ".join(f"{c} {'INTEGER' if t == 'number' else 'TEXT'}" for c, t in table.columns)
            fk = f", FOREIGN KEY ({db.fk}) REFERENCES {db.parent.name}(id)" if table is db.child else ""
            con.execute(f"CREATE TABLE {table.name} (id INTEGER PRIMARY KEY, {cols}{fk})")
            marks = ", ".join("?" * (len(table.columns) + 1))
            con.executemany(f"INSERT INTO {table.name} VALUES ({marks})", rows[table.name])
        con.commit()
    finally:
        con.close()


def _tables_entry(db: _Db) -> dict[str, Any]:
    cols: list[list[Any]] = [[-1, "*"]]
    types = ["text"]
    primary, foreign = [], []
    for t_idx, table in enumerate((db.parent, db.child)):
        primary.append(len(cols))
        cols.append([t_idx, "id"])
        types.append("number")
        for c, typ in table.columns:
            if table is db.child and c == db.fk:
                foreign.append([len(cols), primary[0]])
            cols.append([t_idx, c])
            types.append(typ)
    return {
        "db_id": db.db_id,
        "table_names_original": [db.parent.name, db.child.name],
        "table_names": [db.parent.name, db.child.name],
        "column_names_original": cols,
        "column_names": [[t, c.replace("_", " ")] for t, c in cols],
        "column_types": types,
        "primary_keys": primary,
        "foreign_keys": foreign,
    }


def _questions(db: _Db, rows: dict[str, list[tuple[Any, ...]]]) -> list[tuple[str, str]]:
    """(question, gold query) pairs of every template over this database's values."""
    qs: list[tuple[str, str]] = []
    for table in (db.parent, db.child):
        t, plural = table.name, table.name + "s"
        qs.append((f"How many {plural} are there?", f"SELECT count(*) FROM {t}"))
        for col, words in table.numeric:
            for agg, agg_words in _AGGS:
                qs.append((f"What is the {agg_words} {words} of all {plural}?", f"SELECT {agg}({col}) FROM {t}"))
            for word, op in (("highest", "DESC"), ("lowest", "ASC")):
                qs.append(
                    (
                        f"What is the {table.label} of the {table.singular} with the {word} {words}?",
                        f"SELECT {table.label} FROM {t} ORDER BY {col} {op} LIMIT 1",
                    )
                )
            label_idx = 1 + [c for c, _ in table.columns].index(table.label)
            for r in rows[t]:
                qs.append(
                    (
                        f"What is the {words} of the {table.singular} whose {table.label} is {r[label_idx]}?",
                        f"SELECT {col} FROM {t} WHERE {table.label} = '{r[label_idx]}'",
                    )
                )
            article = "an" if words[0] in "aeiou" else "a"
            for n in _THRESHOLDS[col]:
                for word, op in (("greater than", ">"), ("less than", "<")):
                    qs.append(
                        (
                            f"How many {plural} have {article} {words} {word} {n}?",
                            f"SELECT count(*) FROM {t} WHERE {col} {op} {n}",
                        )
                    )
                    qs.append(
                        (
                            f"List the {table.label}s of {plural} with {article} {words} {word} {n}.",
                            f"SELECT {table.label} FROM {t} WHERE {col} {op} {n}",
                        )
                    )
        for col in table.categorical:
            idx = 1 + [c for c, _ in table.columns].index(col)
            for v in sorted({r[idx] for r in rows[t]}):
                qs.append((f"How many {plural} have the {col} {v}?", f"SELECT count(*) FROM {t} WHERE {col} = '{v}'"))
                qs.append(
                    (
                        f"List the {table.label}s of {plural} whose {col} is {v}.",
                        f"SELECT {table.label} FROM {t} WHERE {col} = '{v}'",
                    )
                )
    p, c = db.parent.name, db.child.name
    for (v,) in ((r[1],) for r in rows[p]):
        on = f"FROM {c} AS T1 JOIN {p} AS T2 ON T1.{db.fk} = T2.id WHERE T2.name = '{v}'"
        qs.append((db.join_phrase.format(v=v), f"SELECT T1.{db.child.label} {on}"))
        qs.append((db.join_count_phrase.format(v=v), f"SELECT count(*) {on}"))
    return qs


_TOKEN = re.compile(r"'[^']*'|\d+|\w+|[^\w\s]")


def _spider_row(db_id: str, question: str, query: str) -> dict[str, Any]:
    toks = _TOKEN.findall(query)
    return {
        "db_id": db_id,
        "query": query,
        "query_toks": toks,
        "query_toks_no_value": ["value" if t.startswith("'") or t.isdigit() else t.lower() for t in toks],
        "question": question,
        "question_toks": re.findall(r"\w+|[^\w\s]", question),
    }


def write_bundled(folder: Path, *, seed: int = 11, dev_share: float = 0.32) -> None:
    """Write the bundled mini-Spider into ``folder`` (deterministic for a seed)."""
    rng = random.Random(seed)
    train: list[dict[str, Any]] = []
    dev: list[dict[str, Any]] = []
    tables = []
    for db in _DBS:
        rows = _rows(db, rng)
        (folder / "database" / db.db_id).mkdir(parents=True)
        _write_db(folder / "database" / db.db_id / f"{db.db_id}.sqlite", db, rows)
        tables.append(_tables_entry(db))
        qs = _questions(db, rows)
        rng.shuffle(qs)
        k = round(len(qs) * dev_share)
        dev += [_spider_row(db.db_id, q, s) for q, s in qs[:k]]
        train += [_spider_row(db.db_id, q, s) for q, s in qs[k:]]
    rng.shuffle(train)
    rng.shuffle(dev)
    for name, data in (("train_spider.json", train), ("dev.json", dev), ("tables.json", tables)):
        (folder / name).write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


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
    for split in SPLITS:
        tasks = load_split(folder, split)
        print(f"{split}: {len(tasks)} questions in {folder / SPLITS[split]}")
        if args.jsonl:
            write_jsonl(tasks, Path(args.jsonl) / f"{split}.jsonl")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
