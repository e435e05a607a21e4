"""Arithmetic tasks, the few-shot prompt, answer parsing and the reward of the quickstart.

Shared by the agent (``agent.py``), the training script (``train.py``) and
``benchmarks/cpu_learning.py``, so all of them ask the same questions the same way.
"""

from __future__ import annotations

import ast
import json
import operator
import random
import re
import zlib
from typing import Any

SYSTEM = "You are a helpful assistant. Always give the final answer as a number inside <answer>...</answer>."

ANSWER = re.compile(r"<answer>\s*(-?\d+)\s*</answer>")

CALCULATOR_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calc",
        "description": "Evaluate arithmetic, e.g. 12 + 7",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}


def few_shot(with_tool: bool) -> list[dict[str, Any]]:
    """Worked examples answered directly; with the tool, one more solved through the calculator.

    The tool example sits in the middle and a direct answer comes last: a 135M model imitates
    the turn just before the question, and ending on the tool's turn made it write
    ``<tool_response>`` blocks itself (held-out accuracy 0.04 instead of about 0.3).
    """
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What is 3 + 5?"},
        {"role": "assistant", "content": "3 + 5 = 8. <answer>8</answer>"},
    ]
    if with_tool:
        messages += [
            {"role": "user", "content": "What is 27 - 9?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_0",
                        "type": "function",
                        "function": {"name": "calc", "arguments": '{"expression": "27 - 9"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_0", "content": "18"},
            {"role": "assistant", "content": "27 - 9 = 18. <answer>18</answer>"},
        ]
    messages += [
        {"role": "user", "content": "What is 20 - 4?"},
        {"role": "assistant", "content": "20 - 4 = 16. <answer>16</answer>"},
    ]
    return messages


def is_heldout(a: int, op: str, b: int) -> bool:
    """Whether the problem ``a op b`` belongs to the held-out problems (about 1 in 8, by a CRC of its text).

    Training questions never ask a held-out problem and held-out questions never ask a training
    one: the held-out accuracy measures arithmetic the model was not trained on.
    """
    return zlib.crc32(f"{a} {op} {b}".encode()) % 8 == 0


N_HELDOUT_PROBLEMS = sum(is_heldout(a, op, b) for a in range(2, 31) for b in range(1, 21) for op in "+-")
"""How many distinct held-out problems there are (144 of the 1,160)."""

HELDOUT_SET = "arithmetic"
"""The held-out set's name in the run record (``result.json``: ``heldout.arithmetic``, headline
``arithmetic/accuracy``) and in the trivial policies' rows: the record names each held-out set by
what it holds, as the other examples do (``unseen_dbs``, ``dev``)."""


def make_tasks(n: int, seed: int, prefix: str, *, heldout: bool) -> list[dict[str, Any]]:
    """``n`` questions ``a + b`` / ``a - b`` (a <= 30, b <= 20), reproducible for a seed.

    ``heldout`` picks the side of the split (:func:`is_heldout`): the held-out problems or the
    training ones; the two never share a problem. Held-out questions are distinct problems
    (at most :data:`N_HELDOUT_PROBLEMS`); training questions may repeat.
    """
    if heldout and n > N_HELDOUT_PROBLEMS:
        raise ValueError(f"there are {N_HELDOUT_PROBLEMS} held-out problems; asked for {n}")
    rng = random.Random(seed)
    tasks: list[dict[str, Any]] = []
    asked: set[tuple[int, str, int]] = set()
    while len(tasks) < n:
        a, b = rng.randint(2, 30), rng.randint(1, 20)
        op = rng.choice("+-")
        if is_heldout(a, op, b) != heldout or (heldout and (a, op, b) in asked):
            continue
        asked.add((a, op, b))
        answer = a + b if op == "+" else a - b
        tasks.append({"task_id": f"{prefix}{len(tasks)}", "question": f"What is {a} {op} {b}?", "answer": answer})
    return tasks


def reward(text: str | None, gold: int) -> float:
    """1.0 for the right number in ``<answer>`` tags, 0.1 for a well-formed wrong one, else 0."""
    match = ANSWER.search(text or "")
    if match is None:
        return 0.0
    return 1.0 if int(match.group(1)) == gold else 0.1


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def calculate(expression: str) -> str:
    """The calculator tool: arithmetic only (no names, no calls), never ``eval``."""

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        raise ValueError(f"not arithmetic: {ast.dump(node)}")

    try:
        value = ev(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError) as exc:
        return f"error: {exc}"
    return str(int(value)) if float(value).is_integer() else f"{value:.4g}"


def tool_replies(tool_calls: Any) -> list[dict[str, Any]]:
    """The ``tool`` messages answering a reply's calculator calls (``message.tool_calls``); a call
    whose arguments are not JSON gets the calculator's error for an empty expression."""
    replies = []
    for call in tool_calls:
        try:
            expression = json.loads(call.function.arguments).get("expression", "")
        except json.JSONDecodeError:
            expression = ""
        replies.append({"role": "tool", "tool_call_id": call.id, "content": calculate(str(expression))})
    return replies
