"""docs/online.md's before/after of the gateway's CPU per call is what
docs/runs/gateway_cpu_per_call.json recorded. Each figure of the passage is tied to its field by a
reference (tests/docs/docs_figures.py checks those); this test checks the record is the
alternating before/after run the passage describes, and that its claims hold in the record: the
CPU per call fell in both arms, and whether the 1 ms target at 64 concurrent is met."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "docs" / "runs" / "gateway_cpu_per_call.json"
ARMS = ("durable", "batched")


def _passage() -> str:
    doc = (ROOT / "docs" / "online.md").read_text()
    found = re.search(r"<!-- gateway-cpu-figures -->(.*?)<!-- /gateway-cpu-figures -->", doc, re.DOTALL)
    assert found is not None, "docs/online.md lost its gateway-cpu-figures markers"
    return " ".join(found.group(1).split())


def _record() -> dict[str, Any]:
    record: dict[str, Any] = json.loads(RECORD.read_text())
    assert record["benchmark"] == "benchmarks/gateway.py"
    return record


def _rows() -> dict[str, dict[str, Any]]:
    return {r["arm"]: r for r in _record()["rows"] if r["api"] == "chat" and r["concurrency"] == 64}


def test_the_record_is_the_alternating_before_after_run_the_passage_describes() -> None:
    record, text = _record(), _passage()
    argv = record["argv"]
    assert "runs/gateway_cpu_per_call.json" in text
    assert argv[argv.index("--arms") + 1 :][:2] == list(ARMS)
    base = record["base_src"]
    assert base and "--base-src" in argv
    commit = re.search(r"main at `([0-9a-f]{7,})`", text)
    assert commit is not None and commit.group(1) in base, "the passage names the base commit the record ran"
    repeats = int(argv[argv.index("--repeat") + 1])
    assert f"{repeats} alternating repeats" in text
    rows = _rows()
    for arm in ARMS:
        for name in (f"{arm}@base", arm):
            assert len(rows[name]["repeats_gateway_cpu_ms_per_call"]) == repeats
            assert rows[name]["gateway_cpu_ms_per_call"] > 0


def test_the_passages_claims_hold_in_the_record() -> None:
    text, rows = _passage(), _rows()
    for arm in ARMS:  # "four costs were cut": the CPU per call fell in both arms
        assert rows[arm]["gateway_cpu_ms_per_call"] < rows[f"{arm}@base"]["gateway_cpu_ms_per_call"]
    met = rows["durable"]["added_p50_ms"] <= 1.0
    assert ("target of at most 1 ms added at p50 at 64 concurrent is met" in text) == met
    assert ("target of at most 1 ms added at p50 at 64 concurrent is **not shown**" in text) == (not met)
