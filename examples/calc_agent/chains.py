"""Calc-X calculation chains: their calculator steps, a canonical key per step, and train/held-out overlap.

A Calc-X ``chain`` is a worked solution: ``<gadget id="calculator">EXPR</gadget>`` calls, each
followed by its ``<output>``, then the result. Two problems share a *step* when one of their
calculator expressions is the same operation on the same operands (``48 / 2``; ``3 + 5`` and
``5 + 3`` are the same step: ``+`` and ``*`` are compared with their operands sorted), and share a
*chain* when their whole sequences of steps are the same. A held-out problem that shares a step
with training is not held out: its arithmetic was seen. :func:`overlap` counts both kinds;
:func:`drop_overlap` removes such problems from a held-out set.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Overlap", "Step", "chain_key", "chain_steps", "drop_overlap", "overlap", "step_key"]

_GADGET = re.compile(r'<gadget id="calculator">(.*?)</gadget>\s*<output>(.*?)</output>', re.DOTALL)
_SYMBOLS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.Pow: "**", ast.Mod: "%", ast.FloorDiv: "//"}
_COMMUTATIVE = (ast.Add, ast.Mult)


@dataclass(frozen=True)
class Step:
    """One calculator call of a chain: the expression and the output Calc-X recorded for it."""

    expression: str
    output: str


def chain_steps(chain: str) -> list[Step]:
    """The calculator steps of a Calc-X ``chain``, in order."""
    return [Step(expr.strip(), out.strip()) for expr, out in _GADGET.findall(chain or "")]


def _number(value: Any) -> str:
    number = float(value)
    return str(int(number)) if number.is_integer() else repr(number)


def _canonical(node: ast.AST) -> str:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _number(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return f"-{_canonical(node.operand)}"
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd):
        return _canonical(node.operand)
    if isinstance(node, ast.BinOp) and type(node.op) in _SYMBOLS:
        left, right = _canonical(node.left), _canonical(node.right)
        if isinstance(node.op, _COMMUTATIVE):
            left, right = sorted((left, right))
        return f"({left} {_SYMBOLS[type(node.op)]} {right})"
    raise ValueError(type(node).__name__)


def step_key(expression: str) -> str:
    """A canonical form of a calculator expression: same operation on the same operands, same key.

    ``"5 + 3"``, ``"3+5"`` and ``"3.0 + 5"`` give ``"(3 + 5)"``; an expression that is not plain
    arithmetic keeps its text with spaces removed.
    """
    text = expression.strip().replace("^", "**").replace("\u00d7", "*").replace("\u00f7", "/").replace(",", "")
    try:
        return _canonical(ast.parse(text, mode="eval").body)
    except (SyntaxError, ValueError):
        return re.sub(r"\s+", "", text)


def chain_key(chain: str) -> tuple[str, ...]:
    """The chain as the sequence of its steps' keys (empty for a chain with no calculator step)."""
    return tuple(step_key(step.expression) for step in chain_steps(chain))


@dataclass(frozen=True)
class Overlap:
    """How many held-out problems share a whole chain, or at least one step, with training."""

    n: int
    """Held-out problems compared."""
    shared_chains: int
    """Held-out problems whose chain (non-empty) equals a training problem's."""
    shared_steps: int
    """Held-out problems with at least one step that a training problem also has."""


def _keys(records: Iterable[Mapping[str, Any]]) -> tuple[set[tuple[str, ...]], set[str]]:
    chains: set[tuple[str, ...]] = set()
    steps: set[str] = set()
    for record in records:
        key = chain_key(str(record.get("chain") or ""))
        if key:
            chains.add(key)
            steps.update(key)
    return chains, steps


def overlap(train: Iterable[Mapping[str, Any]], heldout: Sequence[Mapping[str, Any]]) -> Overlap:
    """Count the held-out problems that share a chain or a step with ``train`` (records with a ``chain``)."""
    chains, steps = _keys(train)
    shared_chains = shared_steps = 0
    for record in heldout:
        key = chain_key(str(record.get("chain") or ""))
        shared_chains += bool(key) and key in chains
        shared_steps += any(k in steps for k in key)
    return Overlap(len(heldout), shared_chains, shared_steps)


def drop_overlap(
    train: Iterable[Mapping[str, Any]], heldout: Sequence[Mapping[str, Any]]
) -> tuple[list[Mapping[str, Any]], int]:
    """``heldout`` without the problems that share a step (hence also a chain) with ``train``; and how many went."""
    _, steps = _keys(train)
    kept = [r for r in heldout if not any(k in steps for k in chain_key(str(r.get("chain") or "")))]
    return kept, len(heldout) - len(kept)
