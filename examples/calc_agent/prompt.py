"""What the calculator agent tells the model: the system message and the worked examples that open
its context (as plain data, so that the held-out set can be checked against them).

Two examples go through the calculator, the last one is answered directly: a 135M model calls a
tool only when it has seen one called, and it imitates the turn just before the question most
(ending on a tool example makes it write the tool's results itself).
"""

from __future__ import annotations

SYSTEM = "Solve the math word problem. Give the final answer as a number inside <answer>...</answer>."

TOOL_EXAMPLES: list[tuple[str, str, str]] = [
    ("Bob buys 4 bags with 6 nuts in each bag. How many nuts is that?", "4 * 6", "24"),
    ("Kim had 23 cups and gave 9 of them away. How many cups are left?", "23 - 9", "14"),
]
"""(question, calculator expression, result) of the examples solved through the calculator."""

DIRECT_EXAMPLE: tuple[str, str, str] = (
    "Ann has 3 pens. Ann gets 5 more. How many pens does Ann have now?",
    "3 + 5",
    "8",
)
"""The example answered directly (last, just before the question)."""


def example_steps() -> list[str]:
    """The calculation steps the prompt shows (the held-out set must not use any of them)."""
    return [expression for _, expression, _ in [*TOOL_EXAMPLES, DIRECT_EXAMPLE]]
