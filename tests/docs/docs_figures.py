"""Every figure in the READMEs and docs/ is tied to the committed record it states.

A *figure* is a number in prose that looks like a measurement: a decimal (``0.562``, ``3.82``), a
percentage (``53 %``), a ratio (``0.85x``, ``10`` followed by a multiplication sign) or a number with thousands separators
(``2,421``). Code blocks, inline code, link targets and HTML comments are not prose. Each figure
must be one of:

- **referenced**: an HTML comment right after it, invisible on GitHub, names the record field it
  states: ``3.82 GB<!--= docs/runs/quickstart_memory_full.json#/runs/0/peak_gb -->``. The part after
  ``#`` is a JSON pointer (RFC 6901; a space in a key is written ``%20``). The figure must equal
  the field at the precision it is written with (``3.82`` matches 3.8151 but not 3.83).
  A derived figure gives an arithmetic expression over fields (``+ - * / **``, parentheses,
  ``min``, ``max``, ``abs``, numbers): ``0.71x<!--= a.json#/async/wall_s / a.json#/sync/wall_s -->``.
  ``<!-- record: PATH -->`` sets the record a reference without a path (``<!--= #/x -->``) reads,
  until the next such comment. The reference ties the last number before it on the same line
  (a whole number too, though one is not a figure by itself: ``562<!--= a.json#/n -->``).
- **in a region generated from records**: ``<!-- figures:NAME -->`` ... ``<!-- /figures:NAME -->``,
  written by ``benchmarks/examples.py --report`` and checked by tests/examples/test_example_records.py.
- **in a region of records**: ``<!-- figures-from: PATH [PATH ...] -->`` ... ``<!-- /figures-from -->``:
  every figure in between equals, at its precision, some number in those records (a table
  copied from a record's printout). Weaker than a reference (a figure edited to another value
  of the same record passes), so use it for tables, references for prose.
- **an unrecorded printout**: ``<!-- unrecorded: REASON -->`` ... ``<!-- /unrecorded -->``: figures a
  benchmark printed whose output was never committed as a record. The reason is required and the
  count of such figures is printed by the test, so the debt stays visible.
- **not a result**: a version, a date, an option's value... Either its context matches
  :data:`NOT_RESULTS` (a short, explicit list), or an HTML comment right after it says why:
  ``T = 1.0<!--not-a-result: the sampling temperature-->``.

``uv run python tests/docs/docs_figures.py [FILE ...]`` lists each file's figures without a tie.
"""

from __future__ import annotations

import ast
import json
import math
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parents[2]


def doc_files(root: Path = ROOT) -> list[Path]:
    """The files whose figures must be tied: README.md, docs/*.md, examples' and packages' READMEs."""
    return sorted(
        {
            root / "README.md",
            *root.glob("docs/*.md"),
            *root.glob("examples/*/README.md"),
            *root.glob("packages/*/README.md"),
        }
    )


NUMBER = re.compile(
    r"(?<![\w.#/\-\u2212])(?P<sign>[\u2212-])?(?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.\d+|\d+)"
    r"(?P<unit>\s?%|x\b|\u00d7)?(?![\w.]*\d)"
)
"""A number in prose; :func:`_is_figure` decides whether it looks like a measurement."""

NOT_RESULTS: list[tuple[str, str]] = [
    (
        r"(?i)(?:python|torch|verl|vllm|cpython|postgresql|debian|pydantic|langchain|langgraph|autogen|transformers|"
        r"openai-agents|ray|agent-lightning|sdk|fastapi|cuda|version|v|llama-index-core|llama-index|"
        r"openinference-instrumentation-llama-index|agentops|semconv|verifiers|openenv|conventions up to)[ =]?[\d.x\u2013-]*$",
        "a version number",
    ),
    (r"(?i)arxiv [\d.]*$", "an arXiv id"),
    (r"(?i)\bT = [\d.]*$", "the sampling temperature a run was configured with"),
    (
        r"(?i)\b(?:lr|learning rate|temperature|top_p|gamma|\u03b3|clip|beta|\u03b2|kl_coef|epsilon|\u03b5)[ =]*[\d.]*$",
        "a hyperparameter's value",
    ),
    (r"(?i)\bsmollm2-$", "a model name"),
    (
        r"(?:\u2264|\u2265|<=|>=|<|>|\bat most|\bat least|\bmore than|\bless than|\babove|\bbelow)\s*[\d.,]*(?:\s?%)?$",
        "a threshold a check uses, not a measurement",
    ),
    (r"(?i)\bgh-$", "an issue number"),
    (r"(?<![\d.])[01]\.0$", "a reward's bounds, 0.0 or 1.0 with one decimal (a result is written 0.000 / 1.000)"),
]
"""Contexts of numbers that are not results: ``(regex on the text before the number, why)``.
The regex is searched in the line up to and including the number. Keep this list short; for a
one-off, put ``<!--not-a-result: why-->`` after the number instead."""


@dataclass
class Figure:
    """One figure of a file: where it is, what it says, and what ties it (``tie``: ``reference``,
    ``generated``, ``region``, ``unrecorded``, ``not-a-result`` or ``""`` when nothing does)."""

    path: Path
    line: int
    text: str
    value: float
    decimals: int
    percent: bool
    start: int
    tie: str = ""
    detail: str = ""


@dataclass
class Report:
    """What :func:`check` found in one file."""

    path: Path
    figures: list[Figure] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def count(self, tie: str) -> int:
        return sum(f.tie == tie for f in self.figures)


# -- masking what is not prose ------------------------------------------------------------------


def _mask(text: str, spans: Iterable[tuple[int, int]]) -> str:
    chars = list(text)
    for start, end in spans:
        for i in range(start, end):
            if chars[i] != "\n":
                chars[i] = " "
    return "".join(chars)


def _fences(text: str) -> list[tuple[int, int]]:
    """Spans of fenced code blocks (``` or ~~~, closed by a fence of the same kind at least as long)."""
    spans, open_at, fence, pos = [], None, "", 0
    for line in text.splitlines(keepends=True):
        stripped = line.strip()
        match = re.match(r"(`{3,}|~{3,})", stripped)
        if open_at is None and match:
            open_at, fence = pos, match.group(1)
        elif open_at is not None and match and stripped == fence[0] * len(stripped) and len(stripped) >= len(fence):
            spans.append((open_at, pos + len(line)))
            open_at = None
        pos += len(line)
    if open_at is not None:
        spans.append((open_at, len(text)))
    return spans


COMMENT = re.compile(r"<!--(.*?)-->", re.S)
INLINE_CODE = re.compile(r"(?P<ticks>`+)(?!`)(?:(?!\n[ \t]*\n)[\s\S])+?(?<!`)(?P=ticks)(?!`)")
"""Inline code, which may run over a line break but not over a blank line."""
LINK_TARGET = re.compile(r"\]\([^)]*\)|\]\[[^\]]*\]|https?://\S+|\[[^\]]*\]:\s*\S+")


# -- records ------------------------------------------------------------------------------------


@cache
def _record(path: str, root: Path = ROOT) -> Any:
    file = root / path
    if not file.is_file():
        raise LookupError(f"no record {path}")
    return json.loads(file.read_text(encoding="utf-8"))


def _pointer(document: Any, pointer: str, where: str) -> Any:
    value = document
    for raw in pointer.split("/")[1:] if pointer else []:
        key = unquote(raw).replace("~1", "/").replace("~0", "~")
        if isinstance(value, list) and key.isdigit() and int(key) < len(value):
            value = value[int(key)]
        elif isinstance(value, dict) and key in value:
            value = value[key]
        else:
            raise LookupError(f"{where}: no {pointer!r} (at {key!r})")
    return value


REF = re.compile(r"(?P<path>[\w.\-/]*\.json)?#(?P<pointer>(?:/[^\s/()*+]*)*)")


def evaluate(expression: str, default: str | None, root: Path = ROOT) -> tuple[float, list[str]]:
    """The value of a reference's expression and the records it read."""
    values: list[float] = []
    paths: list[str] = []

    def substitute(match: re.Match[str]) -> str:
        path = match.group("path") or default
        if path is None:
            raise LookupError(f"{match.group(0)!r} names no record and no <!-- record: PATH --> comes before it")
        value = _pointer(_record(path, root), match.group("pointer"), path)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise LookupError(f"{path}#{match.group('pointer')} is {value!r}, not a number")
        values.append(float(value))
        paths.append(path)
        return f"_v[{len(values) - 1}]"

    code = REF.sub(substitute, expression.strip())
    tree = ast.parse(code, mode="eval")
    allowed = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Constant, ast.Subscript, ast.Name, ast.Load, ast.Call)
    allowed_ops = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Pow, ast.USub, ast.UAdd)
    for node in ast.walk(tree):
        if isinstance(node, ast.operator | ast.unaryop):
            if not isinstance(node, allowed_ops):
                raise ValueError(f"{expression!r}: only + - * / ** are allowed")
        elif not isinstance(node, allowed):
            raise ValueError(f"{expression!r}: {type(node).__name__} is not allowed in a reference")
        if isinstance(node, ast.Name) and node.id not in ("_v", "min", "max", "abs"):
            raise ValueError(f"{expression!r}: unknown name {node.id!r}")
    result = eval(
        compile(tree, "<reference>", "eval"), {"__builtins__": {}, "min": min, "max": max, "abs": abs, "_v": values}
    )
    return float(result), paths


def _numbers(document: Any) -> list[float]:
    if isinstance(document, dict):
        return [x for v in document.values() for x in _numbers(v)]
    if isinstance(document, list):
        return [x for v in document for x in _numbers(v)]
    if isinstance(document, int | float) and not isinstance(document, bool):
        return [float(document)]
    return []


def matches(figure: Figure, value: float) -> bool:
    """Whether ``value`` written at the figure's precision reads as the figure."""
    if math.isnan(value):
        return False
    half = 0.5 * 10 ** (-figure.decimals)
    return abs(value - figure.value) <= half * (1 + 1e-9) + 1e-12


# -- scanning -----------------------------------------------------------------------------------


def _is_figure(match: re.Match[str]) -> bool:
    num = match.group("num")
    return "." in num or "," in num or bool(match.group("unit"))


def figures(path: Path, text: str) -> tuple[list[Figure], str, list[re.Match[str]]]:
    """The figure-looking numbers of a file's prose, the masked prose, and its HTML comments."""
    masked = _mask(text, _fences(text))
    # comments and inline code, whichever starts first (a comment in inline code is an example)
    spans = list(re.finditer(f"{COMMENT.pattern}|{INLINE_CODE.pattern}", masked, re.S))
    comments = [COMMENT.fullmatch(masked, m.start(), m.end()) for m in spans if m.group(0).startswith("<!--")]
    comments = [c for c in comments if c is not None]
    masked = _mask(masked, [m.span() for m in spans])
    masked = _mask(masked, [m.span() for m in LINK_TARGET.finditer(masked)])
    found = [_figure(path, text, match) for match in NUMBER.finditer(masked) if _is_figure(match)]
    return found, masked, comments


def _figure(path: Path, text: str, match: re.Match[str]) -> Figure:
    num = match.group("num").replace(",", "")
    value = float(num) * (-1 if match.group("sign") else 1)
    decimals = len(num.partition(".")[2])
    line = text.count("\n", 0, match.start()) + 1
    percent = "%" in (match.group("unit") or "")
    return Figure(path, line, match.group(0).strip(), value, decimals, percent, match.start())


def _regions(comments: list[re.Match[str]], kind: str, closing: str) -> list[tuple[int, int, str]]:
    """(start, end, argument) of each ``<!-- kind ARG -->`` ... ``<!-- closing -->`` region."""
    regions, open_at = [], None
    for c in comments:
        body = c.group(1).strip()
        if body.startswith(kind) and open_at is None:
            open_at = (c.end(), body[len(kind) :].strip())
        elif body.startswith(closing) and open_at is not None:
            regions.append((open_at[0], c.start(), open_at[1]))
            open_at = None
    return regions


def check(path: Path, text: str | None = None, root: Path = ROOT) -> Report:
    """Tie every figure of ``path`` (or of ``text`` as if it were ``path``) and report what is not."""
    text = path.read_text(encoding="utf-8") if text is None else text
    report = Report(path)
    found, masked, comments = figures(path, text)
    report.figures = found
    where = path.relative_to(root) if path.is_relative_to(root) else path

    def located(pos: int) -> str:
        return f"{where}:{text.count(chr(10), 0, pos) + 1}"

    # inline references and not-a-result notes: each ties the last figure before it on its line
    default: str | None = None
    for c in comments:
        body = c.group(1).strip()
        if body.startswith("record:"):
            default = body.removeprefix("record:").strip()
            continue
        inline = body.startswith("=") or body.startswith("not-a-result:")
        if not inline:
            continue
        line_start = text.rfind("\n", 0, c.start()) + 1
        numbers = list(NUMBER.finditer(masked, line_start, c.start()))
        if not numbers:
            report.problems.append(f"{located(c.start())}: <!--{body}--> follows no figure on its line")
            continue
        figure = next((f for f in found if f.start == numbers[-1].start()), None)
        if figure is None:  # a whole number (not a figure by itself) tied explicitly
            figure = _figure(path, text, numbers[-1])
            found.append(figure)
        if figure.tie:
            report.problems.append(f"{located(c.start())}: {figure.text} is tied twice")
            continue
        if body.startswith("not-a-result:"):
            reason = body.removeprefix("not-a-result:").strip()
            if not reason:
                report.problems.append(f"{located(c.start())}: <!--not-a-result:--> needs a reason")
            figure.tie, figure.detail = "not-a-result", reason
            continue
        expression = body[1:].strip()
        figure.tie, figure.detail = "reference", expression
        try:
            value, _ = evaluate(expression, default, root)
        except (LookupError, ValueError, SyntaxError, ZeroDivisionError) as error:
            report.problems.append(
                f"{located(figure.start)}: {figure.text}: bad reference <!--= {expression} -->: {error}"
            )
            continue
        if not matches(figure, value):
            report.problems.append(
                f"{located(figure.start)}: the text says {figure.text}, its record says {value:.6g} ({expression})"
            )

    # regions
    for start, end, name in _regions(comments, "figures:", "/figures:"):
        for f in found:
            if start <= f.start < end and not f.tie:
                f.tie, f.detail = "generated", name
    for start, end, reason in _regions(comments, "unrecorded:", "/unrecorded"):
        if not reason:
            report.problems.append(f"{located(start)}: <!-- unrecorded: --> needs a reason")
        for f in found:
            if start <= f.start < end and not f.tie:
                f.tie, f.detail = "unrecorded", reason
    for start, end, paths in _regions(comments, "figures-from:", "/figures-from"):
        try:
            pool = [x for p in paths.split() for x in _numbers(_record(p, root))]
        except LookupError as error:
            report.problems.append(f"{located(start)}: {error}")
            continue
        for f in found:
            if start <= f.start < end and not f.tie:
                f.tie, f.detail = "region", paths
                if not any(matches(f, x) or (f.percent and matches(f, 100 * x)) for x in pool):
                    report.problems.append(f"{located(f.start)}: {f.text} is in none of {paths}")

    # the allow-list, then what is left
    lines = masked.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    for f in found:
        if f.tie:
            continue
        line_start = offsets[f.line - 1]
        context = text[line_start : f.start + len(f.text)]
        context = context[: len(context) - len(f.text)] + f.text.split()[0]
        for pattern, reason in NOT_RESULTS:
            if re.search(pattern, context):
                f.tie, f.detail = "not-a-result", reason
                break
        else:
            report.problems.append(
                f"{located(f.start)}: {f.text} is tied to no record (see tests/docs/docs_figures.py)"
            )
    return report


def main(argv: list[str]) -> int:
    paths = [Path(a).resolve() for a in argv] or doc_files()
    bad = 0
    for path in paths:
        report = check(path)
        for problem in report.problems:
            print(problem)
        bad += len(report.problems)
    print(f"{bad} problem(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
