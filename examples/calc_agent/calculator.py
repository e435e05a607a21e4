"""The agent's calculator: arithmetic over numbers with ``+ - * / **`` and parentheses, never ``eval``.

The expression is parsed with :mod:`ast` and only number literals, the five binary operators
and unary ``+``/``-`` are evaluated; a name, a call, an attribute, a string, a huge power or an
over-long expression raises :class:`CalculatorError` with a message the model can read.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable

MAX_CHARS = 200
"""Longest expression accepted."""
MAX_NODES = 60
"""Most syntax-tree nodes accepted (numbers and operators)."""
MAX_EXPONENT = 64
"""Largest absolute exponent of ``**``."""
MAX_MAGNITUDE = 1e15
"""Largest absolute value of any intermediate result."""

_BINARY: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[float], float]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class CalculatorError(ValueError):
    """The expression is not plain arithmetic, or its value is out of bounds."""


def _check(value: float) -> float:
    if isinstance(value, complex) or not math.isfinite(value) or abs(value) > MAX_MAGNITUDE:
        raise CalculatorError(f"result out of range (|x| <= {MAX_MAGNITUDE:g})")
    return value


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _check(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise CalculatorError(f"exponent {right:g} too large (at most {MAX_EXPONENT})")
        if isinstance(node.op, ast.Div) and right == 0:
            raise CalculatorError("division by zero")
        try:
            return _check(_BINARY[type(node.op)](left, right))
        except OverflowError as exc:
            raise CalculatorError(f"result out of range (|x| <= {MAX_MAGNITUDE:g})") from exc
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    what = type(node).__name__
    raise CalculatorError(f"only numbers, + - * / ** and parentheses are allowed (found {what})")


def evaluate(expression: str) -> float:
    """The value of an arithmetic expression such as ``(12 + 3) * 4``."""
    text = expression.strip().replace("^", "**").replace("\u00d7", "*").replace("\u00f7", "/")
    if not text:
        raise CalculatorError("empty expression")
    if len(text) > MAX_CHARS:
        raise CalculatorError(f"expression longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise CalculatorError(f"not an arithmetic expression: {expression!r}") from exc
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise CalculatorError(f"expression has more than {MAX_NODES} parts")
    return _eval(tree.body)


def format_number(value: float) -> str:
    """``24`` for whole numbers, else up to 10 significant digits (``2.5``, ``0.3333333333``)."""
    if float(value).is_integer():
        return str(int(value))
    return f"{value:.10g}"
