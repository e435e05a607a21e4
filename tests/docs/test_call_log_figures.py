"""docs/online.md's cost of durable calls with the call log is what docs/runs/gateway_call_log.json
recorded. Each figure of the passage is tied to its field by a reference (tests/docs/docs_figures.py
checks those); this test checks the record is the alternating three-arm run the passage describes,
and that its verdict holds in the record: whether the 1 ms target at 64 concurrent is met."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "docs" / "runs" / "gateway_call_log.json"


def _passage() -> str:
    doc = (ROOT / "docs" / "online.md").read_text()
    found = re.search(r"<!-- call-log-figures -->(.*?)<!-- /call-log-figures -->", doc, re.DOTALL)
    assert found is not None, "docs/online.md lost its call-log-figures markers"
    return " ".join(found.group(1).split())


def _rows() -> dict[tuple[str, int], dict[str, float]]:
    record = json.loads(RECORD.read_text())
    assert record["benchmark"] == "benchmarks/gateway.py"
    assert record["argv"][record["argv"].index("--arms") + 1 :][:3] == ["durable", "commit", "batched"]
    return {(r["arm"], r["concurrency"]): r for r in record["rows"] if r["api"] == "chat"}


def test_the_passage_names_the_record_and_its_verdicts_hold() -> None:
    text, rows = _passage(), _rows()
    assert "runs/gateway_call_log.json" in text
    durable = rows[("durable", 64)]
    met = durable["added_p50_ms"] <= 1.0
    assert ("target of at most 1 ms added at p50 at 64 concurrent is met" in text) == met
    assert ("target of at most 1 ms added at p50 at 64 concurrent is **not shown**" in text) == (not met)
    for arm in ("durable", "commit", "batched"):  # every arm at both concurrencies, CPU measured
        for concurrency in (64, 1):
            assert rows[(arm, concurrency)]["gateway_cpu_ms_per_call"] > 0


def test_every_row_has_its_alternating_repeats() -> None:
    record = json.loads(RECORD.read_text())
    repeats = int(record["argv"][record["argv"].index("--repeat") + 1])
    assert f"{repeats} alternating repeats" in _passage()
    for row in record["rows"]:
        assert len(row["repeats_added_p50_ms"]) == repeats
        assert abs(row["added_p50_ms"] - (row["gateway_p50_ms"] - row["direct_p50_ms"])) < 0.002  # rounded apart
