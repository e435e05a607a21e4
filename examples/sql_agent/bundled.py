"""The bundled mini-Spider: small SQLite databases and templated questions, written in Spider's layout.

Ten databases of two tables each (a parent and a child with a foreign key). Seven are training
databases; three (``airline``, ``museum``, ``orchard``) are **held-out databases**: none of their
questions is in ``train_spider.json`` and none of their table names occurs in a training
database, as in Spider's own split by database. ``dev.json`` holds two held-out kinds:

- **unseen databases**: questions on the three held-out databases;
- **seen databases, new questions**: questions on training databases whose gold query, with its
  literals masked (Spider's ``query_toks_no_value``), equals no training query -- a new
  (operation, column) combination on a known schema, never the same query with other values.

Every question comes from one set of English templates (counts, filters, aggregates, "the one
with the highest", lookups by name, one-join lists and counts), so what a model learns on the
training databases -- how a question's words map to a query over the schema in the prompt -- is
what the held-out databases ask for.
"""

from __future__ import annotations

import json
import random
import re
import sqlite3
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SEED = 11
HELDOUT_DBS = ("airline", "museum", "orchard")
"""Databases with no training question (the "unseen databases" held-out set)."""
SEEN_SKELETON_SHARE = 0.35
"""Share of each training database's query skeletons kept for the held-out set."""
PER_SKELETON = 2
"""Held-out questions per skeleton at most (a skeleton with many literals is not over-weighted)."""
UNSEEN_PER_DB = 40


@dataclass(frozen=True)
class _Table:
    name: str
    plural: str
    label: str  # the name-like column the questions ask for
    columns: tuple[tuple[str, str], ...]  # (name, spider type) without the id
    numeric: tuple[tuple[str, str], ...] = ()  # (column, words) for numeric filters and aggregates
    categorical: tuple[str, ...] = ()  # columns for equality filters


@dataclass(frozen=True)
class _Db:
    db_id: str
    parent: _Table
    child: _Table
    fk: str  # child column referencing parent.id
    join_phrase: str  # e.g. "List the names of employees in the {v} department."
    join_count_phrase: str


def _db(db_id: str, parent: _Table, child: _Table, join: str, join_count: str) -> _Db:
    return _Db(db_id, parent, child, f"{parent.name}_id", join, join_count)


_DBS = (
    _db(
        "company",
        _Table("department", "departments", "name", (("name", "text"), ("city", "text")), (), ("city",)),
        _Table(
            "employee",
            "employees",
            "name",
            (("name", "text"), ("department_id", "number"), ("salary", "number"), ("age", "number")),
            (("salary", "salary"), ("age", "age")),
        ),
        "List the names of employees in the {v} department.",
        "How many employees work in the {v} department?",
    ),
    _db(
        "school",
        _Table("teacher", "teachers", "name", (("name", "text"), ("subject", "text")), (), ("subject",)),
        _Table(
            "student",
            "students",
            "name",
            (("name", "text"), ("teacher_id", "number"), ("grade", "number"), ("age", "number")),
            (("grade", "grade"), ("age", "age")),
        ),
        "List the names of students taught by {v}.",
        "How many students are taught by {v}?",
    ),
    _db(
        "shop",
        _Table("supplier", "suppliers", "name", (("name", "text"), ("country", "text")), (), ("country",)),
        _Table(
            "product",
            "products",
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
        "List the names of products supplied by {v}.",
        "How many products are supplied by {v}?",
    ),
    _db(
        "library",
        _Table("author", "authors", "name", (("name", "text"), ("country", "text")), (), ("country",)),
        _Table(
            "book",
            "books",
            "title",
            (("title", "text"), ("author_id", "number"), ("year", "number"), ("pages", "number"), ("genre", "text")),
            (("year", "year"), ("pages", "pages")),
            ("genre",),
        ),
        "List the titles of books written by {v}.",
        "How many books were written by {v}?",
    ),
    _db(
        "hospital",
        _Table("ward", "wards", "name", (("name", "text"), ("building", "text")), (), ("building",)),
        _Table(
            "patient",
            "patients",
            "name",
            (("name", "text"), ("ward_id", "number"), ("age", "number"), ("weight", "number")),
            (("age", "age"), ("weight", "weight")),
        ),
        "List the names of patients in the {v} ward.",
        "How many patients are in the {v} ward?",
    ),
    _db(
        "league",
        _Table("team", "teams", "name", (("name", "text"), ("city", "text")), (), ("city",)),
        _Table(
            "player",
            "players",
            "name",
            (
                ("name", "text"),
                ("team_id", "number"),
                ("goals", "number"),
                ("height", "number"),
                ("position", "text"),
            ),
            (("goals", "goals"), ("height", "height")),
            ("position",),
        ),
        "List the names of players of the {v} team.",
        "How many players play for the {v} team?",
    ),
    _db(
        "garage",
        _Table("owner", "owners", "name", (("name", "text"), ("city", "text")), (), ("city",)),
        _Table(
            "car",
            "cars",
            "model",
            (("model", "text"), ("owner_id", "number"), ("mileage", "number"), ("year", "number"), ("color", "text")),
            (("mileage", "mileage"), ("year", "year")),
            ("color",),
        ),
        "List the models of cars owned by {v}.",
        "How many cars are owned by {v}?",
    ),
    # -- held-out databases: no training question, no table name shared with a training database --
    _db(
        "airline",
        _Table("airport", "airports", "name", (("name", "text"), ("country", "text")), (), ("country",)),
        _Table(
            "pilot",
            "pilots",
            "name",
            (("name", "text"), ("airport_id", "number"), ("age", "number"), ("flights", "number")),
            (("age", "age"), ("flights", "flights")),
        ),
        "List the names of pilots based at {v}.",
        "How many pilots are based at {v}?",
    ),
    _db(
        "museum",
        _Table("gallery", "galleries", "name", (("name", "text"), ("city", "text")), (), ("city",)),
        _Table(
            "painting",
            "paintings",
            "title",
            (
                ("title", "text"),
                ("gallery_id", "number"),
                ("year", "number"),
                ("price", "number"),
                ("style", "text"),
            ),
            (("year", "year"), ("price", "price")),
            ("style",),
        ),
        "List the titles of paintings in the {v} gallery.",
        "How many paintings are in the {v} gallery?",
    ),
    _db(
        "orchard",
        _Table("farm", "farms", "name", (("name", "text"), ("region", "text")), (), ("region",)),
        _Table(
            "tree",
            "trees",
            "variety",
            (("variety", "text"), ("farm_id", "number"), ("height", "number"), ("harvest", "number")),
            (("height", "height"), ("harvest", "harvest")),
        ),
        "List the varieties of trees on the {v} farm.",
        "How many trees grow on the {v} farm?",
    ),
)

_PEOPLE = [
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
    "Abel",
    "Bettina",
    "Carlos",
    "Dorota",
    "Elif",
    "Farid",
    "Greta",
    "Hugo",
    "Ines",
    "Jamal",
    "Kira",
    "Luca",
    "Maja",
    "Nadia",
    "Oskar",
    "Petra",
    "Rafael",
    "Selma",
    "Tobias",
    "Ursula",
    "Viktor",
    "Wanda",
    "Xenia",
    "Yusuf",
    "Zora",
]
_VALUES: dict[tuple[str, str], list[str]] = {
    ("department", "name"): ["Sales", "Research", "Finance", "Support"],
    ("department", "city"): ["Berlin", "Paris", "Berlin", "Madrid"],
    ("teacher", "name"): ["Mr Smith", "Ms Jones", "Mr Brown", "Ms Green"],
    ("teacher", "subject"): ["Math", "History", "Math", "Biology"],
    ("supplier", "name"): ["Acme", "Globex", "Initech", "Umbrella"],
    ("supplier", "country"): ["France", "Japan", "France", "Brazil"],
    ("author", "name"): ["Ada Lee", "Ben Okri", "Cora Diaz", "Dan Brown"],
    ("author", "country"): ["Canada", "Nigeria", "Canada", "Mexico"],
    ("ward", "name"): ["Cardiology", "Surgery", "Pediatrics", "Oncology"],
    ("ward", "building"): ["North", "South", "North", "East"],
    ("team", "name"): ["Lions", "Falcons", "Sharks", "Wolves"],
    ("team", "city"): ["Leeds", "Porto", "Leeds", "Genoa"],
    ("owner", "name"): ["Kim Park", "Leo Rossi", "Mia Wong", "Ned Stark"],
    ("owner", "city"): ["Oslo", "Lyon", "Oslo", "Turin"],
    ("airport", "name"): ["Heathrow", "Narita", "Changi", "Schiphol"],
    ("airport", "country"): ["England", "Japan", "England", "Netherlands"],
    ("gallery", "name"): ["Uffizi", "Prado", "Louvre", "Tate"],
    ("gallery", "city"): ["Florence", "Madrid", "Florence", "London"],
    ("farm", "name"): ["Sunny Hill", "Green Acre", "Oak Valley", "Red Barn"],
    ("farm", "region"): ["Kent", "Devon", "Kent", "Cornwall"],
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
    ("player", "position"): ["Goalkeeper", "Defender", "Forward"],
    ("car", "model"): [
        "Corolla",
        "Civic",
        "Golf",
        "Polo",
        "Focus",
        "Fiesta",
        "Clio",
        "Panda",
        "Yaris",
        "Astra",
        "Octavia",
        "Mazda",
    ],
    ("car", "color"): ["Red", "White", "Black"],
    ("painting", "title"): [
        "Morning Light",
        "Still Water",
        "The Harbor",
        "Green Fields",
        "Winter Road",
        "Two Sisters",
        "The Garden",
        "Evening Bell",
        "Storm Coast",
        "Blue Door",
        "Market Day",
        "Old Mill",
    ],
    ("painting", "style"): ["Baroque", "Cubist", "Impressionist"],
    ("tree", "variety"): [
        "Gala",
        "Fuji",
        "Braeburn",
        "Jazz",
        "Cox",
        "Bramley",
        "Conference",
        "Comice",
        "Bartlett",
        "Anjou",
        "Bosc",
        "Jonagold",
    ],
}
_NUMERIC = {
    # column: (low, high, scale) of the distinct values drawn, and the thresholds of the filter questions
    "salary": ((30, 99, 1000), (40000, 50000, 60000, 70000, 80000)),
    "age": ((18, 65, 1), (25, 30, 40, 50)),
    "grade": ((50, 100, 1), (60, 70, 80, 90)),
    "price": ((3, 90, 1), (10, 20, 40, 60)),
    "stock": ((1, 60, 1), (10, 20, 30, 40)),
    "year": ((1950, 2023, 1), (1970, 1990, 2000, 2010)),
    "pages": ((100, 900, 1), (200, 300, 500, 700)),
    "weight": ((45, 120, 1), (60, 70, 80, 100)),
    "goals": ((0, 40, 1), (5, 10, 20, 30)),
    "height": ((150, 210, 1), (170, 180, 190, 200)),
    "mileage": ((5, 250, 1000), (50000, 100000, 150000, 200000)),
    "flights": ((10, 900, 1), (100, 300, 500, 700)),
    "harvest": ((20, 400, 1), (50, 100, 200, 300)),
}
_AGGS = (("avg", "average"), ("max", "maximum"), ("min", "minimum"), ("sum", "total"))
_TOKEN = re.compile(r"'[^']*'|\d+(?:\.\d+)?|\w+|[^\w\s]")


def masked(query: str) -> tuple[str, ...]:
    """A query's tokens with literals masked and words lower-cased (Spider's ``query_toks_no_value``)."""
    return tuple("value" if t.startswith("'") or t[0].isdigit() else t.lower() for t in _TOKEN.findall(query))


# -- the databases -----------------------------------------------------------------------------------


def _rows(db: _Db, rng: random.Random) -> dict[str, list[tuple[Any, ...]]]:
    parent_rows = [(i + 1, *(_VALUES[(db.parent.name, c)][i] for c, _ in db.parent.columns)) for i in range(4)]
    n = rng.randint(9, 12)
    labels = _VALUES.get((db.child.name, db.child.label)) or rng.sample(_PEOPLE, n)
    numbers = {}
    for col, _ in db.child.numeric:
        (lo, hi, scale), _ = _NUMERIC[col]
        numbers[col] = [v * scale for v in rng.sample(range(lo, hi + 1), n)]  # distinct: no ties at the top
    child_rows = []
    for i in range(n):
        row: list[Any] = [i + 1]
        for col, _ in db.child.columns:
            if col == db.child.label:
                row.append(labels[i])
            elif col == db.fk:
                row.append(1 + (i % 3) if i < 7 else rng.randint(1, 3))  # parent 4 has no children
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


# -- the questions -----------------------------------------------------------------------------------


def _plural(word: str) -> str:
    return word[:-1] + "ies" if word.endswith("y") else word + "s"


def _questions(db: _Db, rows: dict[str, list[tuple[Any, ...]]]) -> list[tuple[str, str]]:
    """(question, gold query) pairs of every template over this database's values."""
    qs: list[tuple[str, str]] = []
    for table in (db.parent, db.child):
        t, plural, singular = table.name, table.plural, table.name
        names = [c for c, _ in table.columns]
        label_idx = 1 + names.index(table.label)
        qs.append((f"How many {plural} are there?", f"SELECT count(*) FROM {t}"))
        for col, words in table.numeric:
            for agg, agg_words in _AGGS:
                qs.append((f"What is the {agg_words} {words} of all {plural}?", f"SELECT {agg}({col}) FROM {t}"))
            for word, op in (("highest", "DESC"), ("lowest", "ASC")):
                qs.append(
                    (
                        f"What is the {table.label} of the {singular} with the {word} {words}?",
                        f"SELECT {table.label} FROM {t} ORDER BY {col} {op} LIMIT 1",
                    )
                )
            for r in rows[t]:
                qs.append(
                    (
                        f"What is the {words} of the {singular} whose {table.label} is {r[label_idx]}?",
                        f"SELECT {col} FROM {t} WHERE {table.label} = '{r[label_idx]}'",
                    )
                )
            article = "an" if words[0] in "aeiou" else "a"
            for n in _NUMERIC[col][1]:
                for word, op in (("greater than", ">"), ("less than", "<")):
                    qs.append(
                        (
                            f"How many {plural} have {article} {words} {word} {n}?",
                            f"SELECT count(*) FROM {t} WHERE {col} {op} {n}",
                        )
                    )
                    qs.append(
                        (
                            f"List the {_plural(table.label)} of {plural} with {article} {words} {word} {n}.",
                            f"SELECT {table.label} FROM {t} WHERE {col} {op} {n}",
                        )
                    )
        for col in table.categorical:
            idx = 1 + names.index(col)
            for v in sorted({r[idx] for r in rows[t]}):
                qs.append((f"How many {plural} have the {col} {v}?", f"SELECT count(*) FROM {t} WHERE {col} = '{v}'"))
                qs.append(
                    (
                        f"List the {_plural(table.label)} of {plural} whose {col} is {v}.",
                        f"SELECT {table.label} FROM {t} WHERE {col} = '{v}'",
                    )
                )
    p, c = db.parent.name, db.child.name
    for r in rows[p]:
        on = f"FROM {c} AS T1 JOIN {p} AS T2 ON T1.{db.fk} = T2.id WHERE T2.name = '{r[1]}'"
        qs.append((db.join_phrase.format(v=r[1]), f"SELECT T1.{db.child.label} {on}"))
        qs.append((db.join_count_phrase.format(v=r[1]), f"SELECT count(*) {on}"))
    return qs


def _spider_row(db_id: str, question: str, query: str) -> dict[str, Any]:
    return {
        "db_id": db_id,
        "query": query,
        "query_toks": _TOKEN.findall(query),
        "query_toks_no_value": list(masked(query)),
        "question": question,
        "question_toks": re.findall(r"\w+|[^\w\s]", question),
    }


def _by_skeleton(pairs: list[tuple[str, str]]) -> dict[tuple[str, ...], list[tuple[str, str]]]:
    groups: dict[tuple[str, ...], list[tuple[str, str]]] = defaultdict(list)
    for question, query in pairs:
        groups[masked(query)].append((question, query))
    return groups


def _sample(groups: dict[tuple[str, ...], list[tuple[str, str]]], rng: random.Random) -> list[tuple[str, str]]:
    return [
        pair for skeleton in groups for pair in rng.sample(groups[skeleton], min(PER_SKELETON, len(groups[skeleton])))
    ]


def write_bundled(folder: Path, *, seed: int = SEED) -> None:
    """Write the bundled mini-Spider into ``folder`` (deterministic for a seed); see the module doc."""
    rng = random.Random(seed)
    train: list[dict[str, Any]] = []
    dev: list[dict[str, Any]] = []
    tables = []
    for db in _DBS:
        rows = _rows(db, rng)
        (folder / "database" / db.db_id).mkdir(parents=True)
        _write_db(folder / "database" / db.db_id / f"{db.db_id}.sqlite", db, rows)
        tables.append(_tables_entry(db))
        groups = _by_skeleton(_questions(db, rows))
        if db.db_id in HELDOUT_DBS:
            pairs = _sample(groups, rng)
            dev += [_spider_row(db.db_id, q, s) for q, s in rng.sample(pairs, min(UNSEEN_PER_DB, len(pairs)))]
            continue
        skeletons = sorted(groups)
        rng.shuffle(skeletons)
        k = round(len(skeletons) * SEEN_SKELETON_SHARE)
        dev += [_spider_row(db.db_id, q, s) for q, s in _sample({s: groups[s] for s in skeletons[:k]}, rng)]
        train += [_spider_row(db.db_id, q, s) for sk in skeletons[k:] for q, s in groups[sk]]
    rng.shuffle(train)
    rng.shuffle(dev)
    for name, data in (("train_spider.json", train), ("dev.json", dev), ("tables.json", tables)):
        (folder / name).write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
