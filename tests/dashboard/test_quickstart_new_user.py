"""What a new user does after the quickstart, on the store it wrote (tiny model, 2 steps, 16
held-out questions, the calculator offered with ``--tool``): ``agentbolt doctor``, ``agentbolt runs list`` in an 80-column terminal,
``agentbolt export``, and the dashboard in Chromium."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from dashboard_helpers import DashboardThread, sql

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # the quickstart run: ~1 min idle, more when busy

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "quickstart" / "train.py"


@pytest.fixture(scope="module")
def quickstart_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    pytest.importorskip("agentbolt_torch")
    root = tmp_path_factory.mktemp("quickstart")
    url = f"sqlite:///{root}/quickstart.db"
    # --tool: the calculator the default no longer offers, so the tool finding has something to find
    args = ["--model", "tiny", "--steps", "2", "--val", "16", "--batch-size", "4", "--val-every", "2", "--tool"]
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--store", url, "--out", str(root / "out"), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=840,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        cwd=root,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return url


def cli(*args: str) -> Any:
    """``agentbolt ARGS`` in an 80-column terminal, in a process of its own as a user runs it (in this
    process, the browser test's Playwright may hold the event loop, whatever order the tests run in)."""
    return subprocess.run(
        [sys.executable, "-m", "agentbolt.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "80"},
    )


def test_the_cli_after_the_quickstart(quickstart_store: str, tmp_path: Path) -> None:
    listed = cli("runs", "list", "--store", quickstart_store, "-q")
    assert listed.returncode == 0, listed.stderr
    (run_id,) = listed.stdout.split()
    table = cli("runs", "list", "--store", quickstart_store).stdout
    assert run_id in table and "succeeded" in table and "…" not in table
    assert max(len(line.rstrip()) for line in table.splitlines()) <= 80

    doctor = cli("doctor", "--store", quickstart_store, "--json")
    report = json.loads(doctor.stdout)
    assert report["capture_ok"]
    assert "singleton_groups" not in {f["code"] for f in report["findings"]}  # held-out groups of one are not trained
    (health,) = report["runs"]
    assert health["held_out"]["tasks"] == 16 and health["first"]["rollouts"] == 16  # 4 questions x 4 samples
    # the random tiny model never calls the calculator it is offered: the finding a new user should see
    assert "tools_never_called" in {f["code"] for f in report["findings"]}

    out = tmp_path / "sft.jsonl"
    export = cli("export", "--store", quickstart_store, "--run", run_id, "--format", "sft-jsonl", "-o", str(out))
    assert export.returncode == 0, export.stdout + export.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert records and all(":step" in r["rollout_id"] for r in records)  # training rollouts only
    assert "32 held-out (val) rollouts left out; --mode all includes them" in export.stderr  # 16 before, 16 after


def test_the_dashboard_after_the_quickstart(quickstart_store: str, page: Any) -> None:
    db = Path(quickstart_store.removeprefix("sqlite:///"))  # (Playwright holds this thread's event loop: no CLI here)
    ((run_id,),) = sql(db, "SELECT run_id FROM runs")
    ((val_id,),) = sql(db, "SELECT rollout_id FROM rollouts WHERE mode = 'val' AND status = 'succeeded' LIMIT 1")
    with DashboardThread(quickstart_store) as dash:
        page.goto(f"{dash.url}/runs/{run_id}")
        assert page.locator("#health-status").inner_text().endswith(("warning", "warnings"))
        codes = {x.get_attribute("data-code") for x in page.locator("#health-findings li").all()}
        assert "tools_never_called" in codes
        numbers = " ".join(page.locator("#training-health").text_content().split())  # (in a collapsed details)
        assert "held-out reward (16 tasks paired, steps 0 and 2" in numbers
        card = page.locator("#summary-card")  # the quickstart names its metric: held-out accuracy leads
        assert card.locator(".tile").first.get_attribute("data-figure") == "accuracy"
        assert "held-out accuracy" in card.inner_text().lower() and "trivial policies" in card.inner_text().lower()
        page.goto(f"{dash.url}/rollouts/{val_id}")
        calls = page.locator("#transitions table").first.locator("tbody tr")
        assert calls.count() >= 1
        assert all(
            calls.nth(i).locator("td").last.inner_text() == "held-out: never trained" for i in range(calls.count())
        )
