"""Calc-X data for the calculator agent: the loader of the real files and of the bundled set.

Calc-X (MU-NLPC, https://huggingface.co/datasets/MU-NLPC/Calc-X) holds arithmetic word problems
as records ``{"id", "question", "chain", "result", "source_ds"}``: ``chain`` is the worked
solution with ``<gadget id="calculator">...</gadget>`` calls and their ``<output>``, ``result``
the answer as a string (``"42"``, ``"3/4"``, ``"2.5"``). The release is parquet
(``data/train-*.parquet``, ``data/validation-*.parquet``, ``data/test-*.parquet``); the same
records as JSON lines (``train.jsonl``...) load too.

Held-out *tiers*: a held-out file named ``test_<tier>`` (or ``validation_<tier>``) is the tier
``<tier>``; other held-out files make one tier named after their split (``test``). The bundled
set (:mod:`bundled`, written on first use into ``~/.cache/agentbolt/examples/calc_agent/``) has
the tiers ``small`` and ``large``. :func:`load` drops every held-out problem that shares a
calculation step with a training problem (:mod:`chains`; none in the bundled set, by
construction) and says how many it dropped.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

from bundled import write_bundled
from chains import drop_overlap

log = logging.getLogger(__name__)

CALC_X_URL = "https://huggingface.co/datasets/MU-NLPC/Calc-X"
CACHE = Path.home() / ".cache" / "agentbolt" / "examples" / "calc_agent"
BUNDLED_VERSION = "v4"
REQUIRED = ("id", "question", "result")
SPLIT_NAMES = {"train": ("train",), "heldout": ("test", "validation")}
_TIER_FILE = re.compile(r"^(?:test|validation)_([A-Za-z]+)$")


class DataError(ValueError):
    """A Calc-X file is missing or holds a malformed record (the message names file and line)."""


def bundled_folder() -> Path:
    """The bundled set's folder (written on first use)."""
    return write_bundled(CACHE / f"bundled-{BUNDLED_VERSION}")


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
        "chain": str(record.get("chain") or ""),
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


def tier_of(path: Path) -> str:
    """The held-out tier of a file: ``test_large.jsonl`` -> ``large``, ``test-00000-of-00001.parquet`` -> ``test``."""
    stem = path.name.split(".")[0]
    match = _TIER_FILE.match(stem)
    return match.group(1) if match else stem.split("-")[0].split("_")[0]


def load_tiers(folder: Path, limit: int | None = None) -> dict[str, list[dict[str, Any]]]:
    """The held-out tiers of ``folder``: ``{tier: tasks}`` (first ``limit`` of each if given)."""
    tiers: dict[str, list[dict[str, Any]]] = {}
    for path in split_files(folder, "heldout"):
        tiers.setdefault(tier_of(path), []).extend(read_records(path))
    for tier, tasks in tiers.items():
        if not tasks:
            raise DataError(f"{folder}: the held-out tier {tier!r} holds no record with a numeric result")
        for task in tasks:
            task["tier"] = tier
    return {tier: tasks[:limit] if limit is not None else tasks for tier, tasks in tiers.items()}


def load(
    data: str | Path | None = None, *, n_val: int | None = None
) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """``(train, {tier: held_out})`` from ``data`` (a Calc-X folder) or the bundled set.

    Held-out problems sharing a calculation step with training are dropped (a warning says how
    many); ``n_val`` then keeps the first ``n_val`` of each tier.
    """
    folder = Path(data) if data else bundled_folder()
    train = load_split(folder, "train")
    tiers: dict[str, list[dict[str, Any]]] = {}
    for tier, tasks in load_tiers(folder).items():
        kept, dropped = drop_overlap(train, tasks)
        if dropped:
            log.warning(
                "held-out tier %r: dropped %d of %d problems that share a calculation step with training",
                tier,
                dropped,
                len(tasks),
            )
        if not kept:
            raise DataError(f"{folder}: every problem of the held-out tier {tier!r} shares a step with training")
        tiers[tier] = kept[:n_val] if n_val is not None else kept
    return train, tiers
