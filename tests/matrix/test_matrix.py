"""The framework compatibility matrix (docs/matrix.md).

The rows whose frameworks are in the workspace (``suite = true`` in ``frameworks.toml``) run here,
each streaming mode in a fresh interpreter, in the workspace environment, after checking that
the installed framework is in the row's tested range. Every row, heavy ones included, runs in an
environment of its own with ``./dev matrix`` (noxfile.py); its committed record
(docs/runs/matrix.json) must hold a passing run of every row, and the support table in
docs/matrix.md must be the one generated from that record.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
import calc  # noqa: E402
import record  # noqa: E402
from row import range_requirements, rows  # noqa: E402

ROWS = rows()
SUITE = [(rid, streaming) for rid, row in ROWS.items() if row.get("suite") for streaming in row["streaming"]]


def _run_row(row: str, streaming: bool, tmp_path: Path) -> dict[str, Any]:
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [sys.executable, str(HERE / "row.py"), row, "--streaming", str(int(streaming)), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=280,
        cwd=tmp_path,
        env={**__import__("os").environ, "AGENTOPS_LOGGING_TO_FILE": "false"},
    )
    assert out.exists(), proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.mark.matrix
@pytest.mark.parametrize(("row", "streaming"), SUITE, ids=[f"{r}-{'stream' if s else 'no-stream'}" for r, s in SUITE])
def test_workspace_row_holds_every_assertion(row: str, streaming: bool, tmp_path: Path) -> None:
    spec = ROWS[row]
    for requirement in map(Requirement, [*spec.get("requires", []), *range_requirements(spec)]):
        installed = importlib.metadata.version(requirement.name)
        assert requirement.specifier.contains(installed, prereleases=True), (
            f"{requirement.name} {installed} is outside the row's tested range {requirement}"
        )
    result = _run_row(row, streaming, tmp_path)
    assert "error" not in result, result["error"]
    failed = {name: check for name, check in result["checks"].items() if not check["ok"]}
    assert not failed, json.dumps(failed, indent=1)
    assert set(result["checks"]) == set(record.CHECKS)
    assert result["passed"]
    # The streaming variant asked the backend to stream every call, the other none.
    counts = result["counts"]
    assert counts["streamed_calls"] == (counts["backend_calls"] if streaming else 0), counts


def test_support_table_is_generated_from_the_committed_record() -> None:
    committed = json.loads(record.RECORD.read_text())
    doc = record.DOC.read_text()
    assert record.render(doc, committed) == doc, "docs/matrix.md's table is stale: run python tests/matrix/record.py"


def test_record_holds_a_passing_run_of_every_row() -> None:
    committed = json.loads(record.RECORD.read_text())
    missing = [rid for rid in ROWS if rid not in committed["rows"]]
    assert not missing, f"rows never run on record: {missing} (./dev matrix --heavy, then commit the record)"
    for rid, result in committed["rows"].items():
        spec = ROWS[rid]
        assert {"commit", "date", "install_s", "requirements"} <= set(result), rid
        if result.get("install_error"):
            assert spec.get("python"), f"{rid} did not install and frameworks.toml says nothing of why"
            continue
        assert sorted(bool(v["streaming"]) for v in result["variants"]) == sorted(spec["streaming"]), rid
        for variant in result["variants"]:
            checks = variant.get("checks", {})
            # The record is consistent: passed means every assertion held, none missing.
            assert variant["passed"] == ("error" not in variant and all(checks[c]["ok"] for c in record.CHECKS)), rid
            assert set(checks) == set(record.CHECKS) or "error" in variant, rid
            if variant["passed"]:
                _assert_passing_variant_agrees_with_the_row(rid, spec, variant)
        passed = bool(result["variants"]) and all(v["passed"] for v in result["variants"])
        if spec.get("pending"):  # a known failure, with its reason: it must still fail on record
            assert not passed, f"{rid} passes now: remove its `pending` note from frameworks.toml"
        else:
            assert passed, f"{rid} failed on record (docs/runs/matrix.json); a known failure needs `pending`"


def _assert_passing_variant_agrees_with_the_row(rid: str, spec: dict[str, Any], variant: dict[str, Any]) -> None:
    """A passing variant on record shows what ``frameworks.toml`` asks of the row today: the
    hand-counted calls on both tasks (backend = gateway = LightningRL = exact ids), the row's agent
    and tool names, the tool names from where the row says (tool spans unless ``tools_from =
    "gateway"``), and, where the record counts them, a stream asked for on every streaming call and
    on no other. A record older than a change to the row or to row.py's checks fails here: re-run it."""
    counts, checks = variant["counts"], variant["checks"]
    hand = int(spec["calls"]) * len(calc.TASKS)
    assert (
        counts["backend_calls"] == counts["gateway_calls"] == counts["lightningrl_calls"] == counts["exact"] == hand
    ), (rid, counts, hand)
    assert checks["agent_names"]["got"] == sorted(spec["agents"]), rid
    assert checks["tool_names"]["got"] == sorted(spec["tools"]), rid
    source = "gateway tool calls" if spec.get("tools_from") == "gateway" else "tool spans"
    assert checks["tool_names"]["source"] == source, (
        f"{rid}: the record read its tool names from {checks['tool_names']['source']}, the row declares {source}"
        " (re-run it: ./dev matrix -s \"matrix(row='" + rid + "')\")"
    )
    if "streamed_calls" in counts:  # counted since af4ef3a12d3e
        assert counts["streamed_calls"] == (counts["backend_calls"] if variant["streaming"] else 0), (rid, counts)
