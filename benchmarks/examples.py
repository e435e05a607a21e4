"""Run the paper's three examples on their CPU defaults and print one table (not part of CI).

    uv run python benchmarks/examples.py                      # sql_agent, rag_agent, calc_agent, one after the other
    uv run python benchmarks/examples.py --only calc_agent    # a subset (repeat --only or give a comma list)
    uv run python benchmarks/examples.py --report             # only the table, from runs/<name>/result.json
    uv run python benchmarks/examples.py --only calc_agent -- --steps 4 --val 32   # extra train.py arguments

Each example's ``examples/<name>/train.py`` runs as its own subprocess with its defaults (SQLite
store ``runs/<name>.db``, results in ``runs/<name>/``); with the SmolLM2 defaults each takes up
to about 40 minutes of training on a 2-core machine. Every train.py writes ``result.json`` with
the same keys (see the examples' READMEs); the table reads them:

- held-out metric before -> after, each +- its standard error (sd / sqrt(n) over the held-out
  tasks), and the gain in standard errors (gain / sqrt(se_before^2 + se_after^2));
- seconds per training step, LLM calls and transitions per training rollout, the share of LLM
  calls recorded with exact token ids, and the calculator-call rate (calc_agent, rag_agent's
  search tool) of held-out rollouts before -> after.

An example whose result.json is missing is reported as such on its own line.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = ("sql_agent", "rag_agent", "calc_agent")
COLUMNS = (
    "example",
    "metric",
    "before -> after (+- se)",
    "gain/se",
    "s/step",
    "calls/rollout",
    "transitions/rollout",
    "exact ids",
    "tool calls before -> after",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", action="append", default=[], help=f"examples to run (of {', '.join(EXAMPLES)})")
    p.add_argument("--report", action="store_true", help="only print the table from existing result.json files")
    p.add_argument("--runs", default=str(REPO / "runs"), help="folder holding <name>/result.json (default runs/)")
    p.add_argument("extra", nargs="*", help="arguments passed to every train.py (after --)")
    args = p.parse_args(argv)
    names = [n for item in args.only for n in item.split(",") if n] or list(EXAMPLES)
    unknown = sorted(set(names) - set(EXAMPLES))
    if unknown:
        p.error(f"unknown example(s) {', '.join(unknown)}; choose from {', '.join(EXAMPLES)}")
    args.names = names
    return args


def _num(x: Any, digits: int = 3) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def row(name: str, result: dict[str, Any]) -> list[str]:
    """One table row from an example's result.json."""
    before, after = result.get("metric_before"), result.get("metric_after")
    se_b, se_a = result.get("metric_stderr_before"), result.get("metric_stderr_after")
    gain = "n/a"
    if None not in (before, after, se_b, se_a):
        se = math.sqrt(se_b**2 + se_a**2)
        gain = f"{(after - before) / se:+.1f}" if se > 0 else "n/a"
    tools = "n/a"
    if result.get("tool_call_rate_before") is not None or result.get("tool_call_rate_after") is not None:
        tools = f"{_num(result.get('tool_call_rate_before'), 2)} -> {_num(result.get('tool_call_rate_after'), 2)}"
    return [
        name,
        str(result.get("metric", "?")),
        f"{_num(before)} +- {_num(se_b)} -> {_num(after)} +- {_num(se_a)} (n={result.get('n_val', '?')})",
        gain,
        _num(result.get("seconds_per_step"), 1),
        _num(result.get("calls_per_rollout"), 2),
        _num(result.get("transitions_per_rollout"), 2),
        _num(result.get("exact_token_id_share"), 3),
        tools,
    ]


def table(names: list[str], runs: Path) -> str:
    """The table for ``names``; a missing or unreadable result.json gets its own line below it."""
    rows, missing = [], []
    for name in names:
        path = runs / name / "result.json"
        try:
            rows.append(row(name, json.loads(path.read_text())))
        except FileNotFoundError:
            missing.append(f"{name}: no result ({path} does not exist; run examples/{name}/train.py)")
        except (json.JSONDecodeError, TypeError) as exc:
            missing.append(f"{name}: unreadable result {path}: {exc}")
    lines = []
    if rows:
        widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(COLUMNS)]
        lines.append("  ".join(c.ljust(w) for c, w in zip(COLUMNS, widths, strict=True)))
        lines.append("  ".join("-" * w for w in widths))
        lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines + missing)


def run_example(name: str, extra: list[str]) -> int:
    """Run ``examples/<name>/train.py`` with its defaults (plus ``extra``); returns its exit status."""
    script = REPO / "examples" / name / "train.py"
    if not script.exists():
        print(f"{name}: skipped ({script} does not exist)", flush=True)
        return 0
    command = [sys.executable, str(script), "--no-progress", *extra]
    print(f"== {name}: {' '.join(command)}", flush=True)
    started = time.monotonic()
    status = subprocess.run(command, cwd=REPO).returncode
    print(f"== {name}: exit {status} after {(time.monotonic() - started) / 60:.1f} min", flush=True)
    return status


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    failed = []
    if not args.report:
        for name in args.names:
            if run_example(name, args.extra) != 0:
                failed.append(name)
    print(table(args.names, Path(args.runs)))
    if failed:
        print(f"failed: {', '.join(failed)} (their rows, if any, are from an earlier run)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
