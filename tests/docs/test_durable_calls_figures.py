"""docs/online.md's cost of durable calls is what docs/runs/gateway_durable_calls*.json recorded:
every figure of the passage between the ``durable-calls-figures`` markers is read from the
records' rows, so a figure edited by hand, or a record replaced without the doc, fails here."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RECORDS = [
    ROOT / "docs" / "runs" / name for name in ("gateway_durable_calls.json", "gateway_durable_calls_round2.json")
]


def _row(rows: list[dict[str, object]], arm: str, concurrency: int) -> dict[str, object]:
    (row,) = [r for r in rows if r["arm"] == arm and r["concurrency"] == concurrency and r["api"] == "chat"]
    return row


def test_the_docs_quote_the_records() -> None:
    doc = (ROOT / "docs" / "online.md").read_text()
    found = re.search(r"<!-- durable-calls-figures -->(.*?)<!-- /durable-calls-figures -->", doc, re.DOTALL)
    assert found is not None, "docs/online.md lost its durable-calls-figures markers"
    text = " ".join(found.group(1).split())
    for path in RECORDS:
        record = json.loads(path.read_text())
        assert record["benchmark"] == "benchmarks/gateway.py" and "--arms" in record["argv"]
        rows = record["rows"]
        assert path.name in text
        repeats = len(_row(rows, "durable", 64)["repeats_added_p50_ms"])  # type: ignore[arg-type]
        assert f"{repeats} alternating repeats" in text
        for concurrency in (64, 1):
            durable, batched = _row(rows, "durable", concurrency), _row(rows, "batched", concurrency)
            expected = (
                f"{concurrency} concurrent: {durable['added_p50_ms']:.2f} / {durable['added_p99_ms']:.2f} ms durable, "
                f"{batched['added_p50_ms']:.2f} / {batched['added_p99_ms']:.2f} ms batched"
            )
            assert expected in text, (expected, text)
        assert f"load average {record['load_average_end'][0]:.1f}" in text
    # the claim that the durable arm was slower at 64 concurrent holds in every record
    for path in RECORDS:
        rows = json.loads(path.read_text())["rows"]
        assert _row(rows, "durable", 64)["added_p50_ms"] > _row(rows, "batched", 64)["added_p50_ms"]  # type: ignore[operator]
