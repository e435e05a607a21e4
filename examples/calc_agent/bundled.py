"""The bundled Calc-X set: word problems in two tiers, held out by construction.

- **small**: numbers mostly below 20, one operation (add, subtract, multiply, divide) or, one time
  in eight, two (add then subtract) -- a 135M model can often do these in its head;
- **large**: 3-digit x 2-digit products, 4- and 5-digit quotients, 3-digit sums and differences,
  and a product plus a 3-digit number -- mental arithmetic fails, the calculator does not.

Every calculation step (an operation on its operands, ``+``/``*`` with operands sorted, see
:func:`chains.step_key`) belongs to exactly one side, by a hash of the step: one step in four is
a held-out step. Training problems use only training steps and held-out problems only held-out
steps, so no held-out problem shares a step, let alone a whole chain, with a training problem
(``tests/examples/test_calc_agent_data.py`` checks it on the written files).

Records are Calc-X's (``id``, ``question``, ``chain``, ``result``, ``source_ds``), written by
:func:`write_bundled` as ``train.jsonl``, ``test_small.jsonl`` and ``test_large.jsonl``.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chains import step_key

__all__ = ["HELDOUT_SHARE", "TIERS", "generate", "is_heldout_step", "write_bundled"]

TIERS = ("small", "large")
HELDOUT_SHARE = 4
"""One step in ``HELDOUT_SHARE`` is a held-out step."""

NAMES = ["Tom", "Anna", "Ben", "Lily", "Sam", "Mia", "Max", "Zoe", "Leo", "Eva", "Tim", "Ada"]
ITEMS = ["apples", "pencils", "stickers", "cookies", "marbles", "books", "cards", "stamps", "shells", "coins"]

Problem = tuple[str, list[tuple[str, int]], int]
"""A question, its calculator steps (expression, value) and its integer answer."""


def is_heldout_step(expression: str) -> bool:
    """Whether a calculation step belongs to the held-out side: a stable hash of its :func:`chains.step_key`."""
    digest = hashlib.sha256(step_key(expression).encode()).digest()
    return int.from_bytes(digest[:8], "big") % HELDOUT_SHARE == 0


def _add(rng: random.Random, a: int, b: int) -> Problem:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    q = rng.choice(
        [
            f"{name} has {a} {item}. {name} gets {b} more. How many {item} does {name} have now?",
            f"There are {a} {item} in a box and {b} {item} on the table. How many {item} are there in all?",
        ]
    )
    return q, [(f"{a} + {b}", a + b)], a + b


def _sub(rng: random.Random, a: int, b: int) -> Problem:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    q = rng.choice(
        [
            f"{name} had {a} {item} and gave {b} of them away. How many {item} are left?",
            f"A shop had {a} {item}. It sold {b} of them. How many {item} does the shop have left?",
        ]
    )
    return q, [(f"{a} - {b}", a - b)], a - b


def _mul(rng: random.Random, a: int, b: int) -> Problem:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    q = rng.choice(
        [
            f"{name} buys {a} bags with {b} {item} in each bag. How many {item} is that?",
            f"A box holds {b} {item}. How many {item} are there in {a} boxes?",
        ]
    )
    return q, [(f"{a} * {b}", a * b)], a * b


def _div(rng: random.Random, b: int, each: int) -> Problem:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    total = b * each
    q = rng.choice(
        [
            f"{name} shares {total} {item} equally among {b} friends. How many {item} does each friend get?",
            f"{total} {item} are packed into {b} equal boxes. How many {item} are in each box?",
        ]
    )
    return q, [(f"{total} / {b}", each)], each


def _small(rng: random.Random) -> Problem:
    kind = rng.choices(["add", "sub", "mul", "div", "add_sub"], weights=[2, 2, 2, 1, 1])[0]
    if kind == "add":
        return _add(rng, rng.randint(2, 19), rng.randint(2, 9))
    if kind == "sub":
        a = rng.randint(6, 19)
        return _sub(rng, a, rng.randint(2, a - 1))
    if kind == "mul":
        return _mul(rng, rng.randint(2, 9), rng.randint(2, 9))
    if kind == "div":
        return _div(rng, rng.randint(2, 9), rng.randint(2, 9))
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b = rng.randint(3, 9), rng.randint(2, 6)
    c = rng.randint(1, a + b - 1)
    q = f"{name} has {a} {item}, finds {b} more and then loses {c}. How many {item} does {name} have now?"
    return q, [(f"{a} + {b}", a + b), (f"{a + b} - {c}", a + b - c)], a + b - c


def _large(rng: random.Random) -> Problem:
    kind = rng.choices(["mul", "div", "add", "sub", "mul_add"], weights=[3, 1, 1, 1, 1])[0]
    if kind == "mul":
        return _mul(rng, rng.randint(100, 999), rng.randint(11, 99))
    if kind == "div":
        return _div(rng, rng.randint(11, 99), rng.randint(100, 999))
    if kind == "add":
        return _add(rng, rng.randint(100, 999), rng.randint(100, 999))
    if kind == "sub":
        a = rng.randint(300, 999)
        return _sub(rng, a, rng.randint(101, a - 100))
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b, c = rng.randint(100, 999), rng.randint(11, 99), rng.randint(100, 999)
    q = (
        f"{name} packs {a} boxes with {b} {item} in each box and has {c} loose {item}. "
        f"How many {item} does {name} have in all?"
    )
    return q, [(f"{a} * {b}", a * b), (f"{a * b} + {c}", a * b + c)], a * b + c


_GENERATORS: dict[str, Callable[[random.Random], Problem]] = {"small": _small, "large": _large}


def _chain(steps: list[tuple[str, int]], result: int) -> str:
    """A Calc-X ``chain``: calculator gadget calls with their outputs, then the result."""
    parts = [f'<gadget id="calculator">{expr}</gadget>\n<output>{value}</output>' for expr, value in steps]
    return "\n\n".join([*parts, f"Final result is <result>{result}</result>"])


def generate(n: int, *, seed: int, tier: str, heldout: bool, id_prefix: str) -> list[dict[str, Any]]:
    """``n`` Calc-X records of ``tier`` with distinct questions, every step on the ``heldout`` side."""
    rng = random.Random(seed)
    records: list[dict[str, Any]] = []
    seen: set[str] = set()
    while len(records) < n:
        question, steps, result = _GENERATORS[tier](rng)
        if question in seen or any(is_heldout_step(expr) != heldout for expr, _ in steps):
            continue
        seen.add(question)
        records.append(
            {
                "id": f"{id_prefix}-{len(records):04d}",
                "question": question,
                "chain": _chain(steps, result),
                "result": str(result),
                "source_ds": f"agentbolt-bundled-{tier}",
            }
        )
    return records


def write_bundled(folder: Path, *, n_train: int = 400, n_test: int = 200) -> Path:
    """Write the bundled set once (``n_train`` training problems per tier, interleaved, and
    ``n_test`` held-out problems per tier); returns the folder."""
    folder = Path(folder)
    names = ["train.jsonl", *(f"test_{tier}.jsonl" for tier in TIERS)]
    if all((folder / name).exists() for name in names):
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    small, large = (
        generate(n_train, seed=1 + i, tier=tier, heldout=False, id_prefix=f"bundled-train-{tier}")
        for i, tier in enumerate(TIERS)
    )
    files = {"train.jsonl": [r for pair in zip(small, large, strict=True) for r in pair]}
    for i, tier in enumerate(TIERS):
        files[f"test_{tier}.jsonl"] = generate(
            n_test, seed=11 + i, tier=tier, heldout=True, id_prefix=f"bundled-test-{tier}"
        )
    for name, records in files.items():
        tmp = folder / f"{name}.tmp"
        tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
        tmp.replace(folder / name)
    return folder
