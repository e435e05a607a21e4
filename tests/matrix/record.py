"""The matrix's results record and the support table generated from it.

    python tests/matrix/record.py            # gather runs/matrix/*.json into docs/runs/matrix.json, regenerate the table
    python tests/matrix/record.py --check    # exit 1 when docs/matrix.md's table is not the record's

``./dev matrix`` runs this after its sessions. Rows not run this time keep their last recorded
result (heavy rows are run apart from the light ones); each row carries the commit and date of
its own run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RECORD = ROOT / "docs" / "runs" / "matrix.json"
DOC = ROOT / "docs" / "matrix.md"
RUNS = ROOT / "runs" / "matrix"
BEGIN, END = "<!-- matrix-table -->", "<!-- /matrix-table -->"
CHECKS = ("completed", "calls", "exact_ids", "agent_names", "tool_names", "rewards", "credit", "no_outbound")
"""Every assertion a row's variant records (row.py), in the table's order."""

sys.path.insert(0, str(HERE))
from row import range_requirements, rows  # noqa: E402


def gather(runs: Path = RUNS, record_path: Path = RECORD) -> dict[str, Any]:
    """The committed record updated with the row files in ``runs`` (each row's newest run)."""
    record: dict[str, Any] = json.loads(record_path.read_text()) if record_path.exists() else {"rows": {}}
    for path in sorted(runs.glob("*.json")):
        data = json.loads(path.read_text())
        if "variants" not in data:  # a variant's own file (ROW-0.json); the row's file holds it
            continue
        # The commit the row ran at (row.py records it; a row whose install failed ran nothing).
        data["commit"] = next((v["commit"] for v in data["variants"] if v.get("commit")), "not run")
        data["date"] = datetime.datetime.fromtimestamp(path.stat().st_mtime, datetime.UTC).isoformat(timespec="seconds")
        record["rows"][data["row"]] = data
    record["rows"] = {rid: record["rows"][rid] for rid in rows() if rid in record["rows"]}
    return record


def _cell_names(variant: dict[str, Any]) -> str:
    checks = variant.get("checks", {})
    agents = ", ".join(f"`{a}`" for a in checks.get("agent_names", {}).get("got", []))
    tools = ", ".join(f"`{t}`" for t in checks.get("tool_names", {}).get("got", []))
    return f"{agents or '—'} / {tools or '—'}"


def _failed(variant: dict[str, Any]) -> list[str]:
    if variant.get("error"):
        return ["error"]
    return [name for name in CHECKS if not variant.get("checks", {}).get(name, {}).get("ok")]


def table(record: dict[str, Any]) -> str:
    """The support table (Markdown), one line per row of ``frameworks.toml``."""
    lines = [
        "| Framework | Instrumentation | Tested range | Ran | Non-streaming | Streaming | Agent / tool names (where from) | Calls (backend = gateway = LightningRL, exact) | Install + run |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for rid, row in rows().items():
        ranges = "<br>".join(f"`{r}`" for r in [*row.get("requires", []), *range_requirements(row)])
        result = record["rows"].get(rid)
        if result is None:
            lines.append(f"| {row['framework']} | {row['instrumentation']} | {ranges} | not run yet | | | | | |")
            continue
        if result.get("install_error"):
            note = row.get("python") or "the install failed (the record has the resolver's message)"
            lines.append(
                f"| {row['framework']} | {row['instrumentation']} | {ranges} | {result['commit']} | "
                f"not installable: {note} | | | | install {result['install_s']} s |"
            )
            continue
        variants = {bool(v.get("streaming")): v for v in result["variants"]}
        first = next(iter(variants.values()))
        ran = "<br>".join(f"{name} {version}" for name, version in first.get("versions", {}).items())
        modes = []
        for streaming in (False, True):
            v = variants.get(streaming)
            if v is None:
                modes.append("not in this row" if streaming not in row["streaming"] else "not run")
            else:
                failed = _failed(v)
                modes.append("pass (all 8 checks)" if not failed else "FAIL: " + ", ".join(failed))
        names = f"{_cell_names(first)} ({row['names']})"
        counts = "; ".join(
            "{b} = {g} = {l}, {e} exact".format(
                b=c.get("backend_calls"), g=c.get("gateway_calls"), l=c.get("lightningrl_calls"), e=c.get("exact")
            )
            for c in (v.get("counts", {}) for v in result["variants"])
        )
        run_s = sum(float(v.get("run_s", 0)) for v in result["variants"])
        lines.append(
            f"| {row['framework']} | {row['instrumentation']} | {ranges} | {ran}<br>({result['commit']}, "
            f"{result['date'][:10]}) | {modes[0]} | {modes[1]} | {names} | {counts} | "
            f"{result['install_s']} s + {run_s:.0f} s |"
        )
    return "\n".join(lines) + "\n"


def render(doc: str, record: dict[str, Any]) -> str:
    """``doc`` with the text between the table markers replaced by the record's table."""
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table(record)}{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only check that docs/matrix.md shows the record")
    args = parser.parse_args(argv)
    if args.check:
        record = json.loads(RECORD.read_text())
        if render(DOC.read_text(), record) != DOC.read_text():
            print("docs/matrix.md's table is not the record's: run python tests/matrix/record.py", file=sys.stderr)
            return 1
        return 0
    record = gather()
    RECORD.write_text(json.dumps(record, indent=1) + "\n")
    DOC.write_text(render(DOC.read_text(), record))
    passed = sum(all(v.get("passed") for v in r["variants"]) and bool(r["variants"]) for r in record["rows"].values())
    print(
        f"{RECORD.relative_to(ROOT)}: {passed} of {len(rows())} rows pass; table regenerated in {DOC.relative_to(ROOT)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
