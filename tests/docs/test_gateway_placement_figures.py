"""docs/online.md's table of the gateway's added latency by backend latency and process placement
is what docs/runs/gateway_latency_placement.json recorded (its numbers are checked against the record by
tests/docs/docs_figures.py, a ``figures-from`` region); this test checks the record is the run the
passage describes (alternating before/after, both placements, every backend latency) and that
each row's verdict on the 1 ms target is the record's."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "docs" / "runs" / "gateway_latency_placement.json"


def _passage() -> str:
    doc = (ROOT / "docs" / "online.md").read_text()
    found = re.search(r"<!-- gateway-placement-figures -->(.*?)<!-- /gateway-placement-figures -->", doc, re.DOTALL)
    assert found is not None, "docs/online.md lost its gateway-placement-figures markers"
    return found.group(1)


def _record() -> dict[str, Any]:
    record: dict[str, Any] = json.loads(RECORD.read_text())
    assert record["benchmark"] == "benchmarks/gateway.py"
    return record


def test_the_record_is_the_run_the_passage_describes() -> None:
    record, text = _record(), " ".join(_passage().split())
    argv = record["argv"]
    assert "runs/gateway_latency_placement.json" in text
    assert record["base_src"] and "--base-src" in argv
    assert argv[argv.index("--placement") + 1 :][:2] == ["shared", "pinned"]
    assert record["staggered_starts"] is True and "(`--stagger`)" in text, "the passage says the clients start spread"
    repeats = int(argv[argv.index("--repeat") + 1])
    assert f"{repeats} alternating repeats" in text
    latencies = {row["backend_latency_ms"] for row in record["rows"]}
    assert {50.0, 200.0, 1000.0} <= latencies, "the 50 ms saturated rows stay, beside realistic latencies"
    for row in record["rows"]:
        assert row["concurrency"] == 64
        assert len(row["repeats_added_p50_ms"]) == repeats
        assert row["gateway_cpu_ms_per_call"] > 0


def test_every_rows_verdict_is_the_records() -> None:
    rows = {
        (row["backend_latency_ms"], row["placement"], row["arm"]): row
        for row in _record()["rows"]
        if row["api"] == "chat"
    }
    seen = set()
    for line in _passage().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        found = re.fullmatch(r"(\d+) ms", cells[0]) if len(cells) > 2 else None
        if found is None:
            continue
        key = (float(found.group(1)), cells[1])
        after = rows[(*key, "durable")]
        before = rows[(*key, "durable@base")]
        assert ("**met**" in cells[-1]) == (after["added_p50_ms"] <= 1.0), line
        assert ("not met" in cells[-1]) == (after["added_p50_ms"] > 1.0), line
        assert f"{after['added_p50_ms']:.2f}" in line and f"{before['added_p50_ms']:.2f}" in line, line
        seen.add(key)
    assert seen == {(lat, place) for lat, place, _ in rows}, "every latency and placement has its row"
