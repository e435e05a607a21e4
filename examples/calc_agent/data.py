"""Calc-X data for the calculator agent: a bundled generator and the loader of the real files.

Calc-X (MU-NLPC, https://huggingface.co/datasets/MU-NLPC/Calc-X) holds arithmetic word problems
as records ``{"id", "question", "chain", "result", "source_ds"}``: ``chain`` is the worked
solution with ``<gadget id="calculator">...</gadget>`` calls and their ``<output>``, ``result``
the answer as a string (``"42"``, ``"3/4"``, ``"2.5"``). The release is parquet
(``data/train-*.parquet``, ``data/validation-*.parquet``, ``data/test-*.parquet``); the same
records as JSON lines (``train.jsonl``...) load too.

The bundled set is written in that format by :func:`write_bundled` (deterministic, small
numbers, one or two operations) into ``~/.cache/agentbolt/examples/calc_agent/`` and read back
by :func:`load_split` -- the same code path as ``--data PATH`` with the real files.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

CALC_X_URL = "https://huggingface.co/datasets/MU-NLPC/Calc-X"
CACHE = Path.home() / ".cache" / "agentbolt" / "examples" / "calc_agent"
BUNDLED_VERSION = "v3"
REQUIRED = ("id", "question", "result")
SPLIT_NAMES = {"train": ("train",), "heldout": ("test", "validation")}

NAMES = ["Tom", "Anna", "Ben", "Lily", "Sam", "Mia", "Max", "Zoe", "Leo", "Eva", "Tim", "Ada"]
ITEMS = ["apples", "pencils", "stickers", "cookies", "marbles", "books", "cards", "stamps", "shells", "coins"]


class DataError(ValueError):
    """A Calc-X file is missing or holds a malformed record (the message names file and line)."""


# -- the bundled set ------------------------------------------------------------------------------


def _chain(steps: list[tuple[str, int]], result: int) -> str:
    """A Calc-X ``chain``: calculator gadget calls with their outputs, then the result."""
    parts = [f'<gadget id="calculator">{expr}</gadget>\n<output>{value}</output>' for expr, value in steps]
    return "\n\n".join([*parts, f"Final result is <result>{result}</result>"])


def _problem(rng: random.Random) -> tuple[str, list[tuple[str, int]], int]:
    """One word problem with small numbers: its text, calculator steps and integer answer.

    Mostly one operation on numbers below 20; one problem in eight takes two.
    """
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    kind = rng.choices(["add", "sub", "mul", "div", "add_sub"], weights=[2, 2, 2, 1, 1])[0]
    if kind == "add":
        a, b = rng.randint(2, 12), rng.randint(2, 9)
        q = f"{name} has {a} {item}. {name} gets {b} more. How many {item} does {name} have now?"
        return q, [(f"{a} + {b}", a + b)], a + b
    if kind == "sub":
        a = rng.randint(6, 19)
        b = rng.randint(2, a - 1)
        q = f"{name} had {a} {item} and gave {b} of them away. How many {item} are left?"
        return q, [(f"{a} - {b}", a - b)], a - b
    if kind == "mul":
        a, b = rng.randint(2, 5), rng.randint(2, 5)
        q = f"{name} buys {a} bags with {b} {item} in each bag. How many {item} is that?"
        return q, [(f"{a} * {b}", a * b)], a * b
    if kind == "div":
        b, each = rng.randint(2, 4), rng.randint(2, 5)
        q = f"{name} shares {b * each} {item} equally among {b} friends. How many {item} does each friend get?"
        return q, [(f"{b * each} / {b}", each)], each
    a, b = rng.randint(3, 9), rng.randint(2, 6)
    c = rng.randint(1, a + b - 1)
    q = f"{name} has {a} {item}, finds {b} more and then loses {c}. How many {item} does {name} have now?"
    return q, [(f"{a} + {b}", a + b), (f"{a + b} - {c}", a + b - c)], a + b - c


def generate(n: int, *, seed: int, split: str) -> list[dict[str, Any]]:
    """``n`` Calc-X records with distinct questions, reproducible for a seed."""
    rng = random.Random(seed)
    records: list[dict[str, Any]] = []
    seen: set[str] = set()
    while len(records) < n:
        question, steps, result = _problem(rng)
        if question in seen:
            continue
        seen.add(question)
        records.append(
            {
                "id": f"bundled-{split}-{len(records):04d}",
                "question": question,
                "chain": _chain(steps, result),
                "result": str(result),
                "source_ds": "agentbolt-bundled",
            }
        )
    return records


def write_bundled(
    folder: Path = CACHE / f"bundled-{BUNDLED_VERSION}", *, n_train: int = 400, n_test: int = 200
) -> Path:
    """Write the bundled set (``train.jsonl``, ``test.jsonl``) once; returns the folder.

    The held-out questions never occur in the training file.
    """
    folder = Path(folder)
    if (folder / "train.jsonl").exists() and (folder / "test.jsonl").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    test = generate(n_test, seed=2, split="test")
    test_questions = {r["question"] for r in test}
    train = [r for r in generate(n_train + n_test, seed=1, split="train") if r["question"] not in test_questions]
    for name, records in (("train", train[:n_train]), ("test", test)):
        tmp = folder / f"{name}.jsonl.tmp"
        tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
        tmp.replace(folder / f"{name}.jsonl")
    return folder


# -- the loader -----------------------------------------------------------------------------------


def parse_number(text: str) -> float | None:
    """A Calc-X ``result`` or a model's answer as a number: ``42``, ``-3.5``, ``1,200``, ``3/4``; else None."""
    s = str(text).strip().replace(",", "").replace(" ", "")
    if not s:
        return None
    try:
        return float(Fraction(s))
    except (ValueError, ZeroDivisionError):
        return None


def _task(record: Any, where: str) -> dict[str, Any] | None:
    if not isinstance(record, dict):
        raise DataError(f"{where}: expected a JSON object with {', '.join(REQUIRED)}, got {type(record).__name__}")
    missing = [k for k in REQUIRED if record.get(k) is None]
    if missing:
        raise DataError(f"{where}: record lacks {', '.join(missing)} (Calc-X records have {', '.join(REQUIRED)})")
    if not isinstance(record["question"], str) or not record["question"].strip():
        raise DataError(f"{where}: 'question' must be a non-empty string")
    answer = parse_number(str(record["result"]))
    if answer is None:
        return None  # e.g. aqua_rat's option letters: not a number to match
    return {
        "task_id": str(record["id"]),
        "question": record["question"].strip(),
        "answer": answer,
        "source": str(record.get("source_ds", "")),
    }


def _raw_records(path: Path) -> Iterator[tuple[str, Any]]:
    """``(where, record)`` for every record of a file; ``where`` is ``file:line`` or ``file: row i``."""
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise DataError(
                f"{path}: reading parquet needs pyarrow (pip install pyarrow), or convert to JSONL"
            ) from exc
        for i, record in enumerate(pq.read_table(path).to_pylist()):
            yield f"{path}: row {i}", record
        return
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(
                    f"{path}:{lineno}: not valid JSON ({exc.msg}); Calc-X JSONL has one record per line"
                ) from exc
            yield f"{path}:{lineno}", record


def read_records(path: Path) -> list[dict[str, Any]]:
    """The numeric tasks of one Calc-X file (``.jsonl``/``.json`` lines or ``.parquet``)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file (the Calc-X release is at {CALC_X_URL})")
    tasks: list[dict[str, Any]] = []
    skipped = 0
    for where, record in _raw_records(path):
        task = _task(record, where)
        if task is None:
            skipped += 1
        else:
            tasks.append(task)
    if skipped:
        log.warning("%s: skipped %d records whose result is not a number", path, skipped)
    return tasks


def split_files(folder: Path, split: str) -> list[Path]:
    """The files of ``split`` (``train`` or ``heldout``: test, else validation) under ``folder``."""
    folder = Path(folder)
    if folder.is_file():
        return [folder]
    if not folder.is_dir():
        raise DataError(f"{folder}: no such file or folder (the Calc-X release is at {CALC_X_URL})")
    for stem in SPLIT_NAMES[split]:
        found = sorted(
            p
            for pattern in (f"{stem}*.jsonl", f"{stem}*.parquet", f"data/{stem}*.jsonl", f"data/{stem}*.parquet")
            for p in folder.glob(pattern)
        )
        if found:
            return found
    wanted = " or ".join(f"{s}*.jsonl/{s}*.parquet" for s in SPLIT_NAMES[split])
    raise DataError(f"{folder}: no {wanted} file (Calc-X's layout: data/train-*.parquet; get it from {CALC_X_URL})")


def load_split(folder: Path, split: str, limit: int | None = None) -> list[dict[str, Any]]:
    """The numeric tasks of a split, in file order (first ``limit`` if given)."""
    tasks: list[dict[str, Any]] = []
    for path in split_files(folder, split):
        tasks += read_records(path)
        if limit is not None and len(tasks) >= limit:
            break
    if not tasks:
        raise DataError(f"{folder}: the {split} split holds no record with a numeric result")
    return tasks[:limit] if limit is not None else tasks


def load(
    data: str | Path | None = None, *, n_val: int | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(train, held_out)`` from ``data`` (a Calc-X folder) or the bundled set."""
    folder = Path(data) if data else write_bundled()
    return load_split(folder, "train"), load_split(folder, "heldout", n_val)
