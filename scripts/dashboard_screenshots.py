"""Screenshots of every dashboard page into docs/img/dashboard-*.png.

Trains two tiny-model runs (torch-grpo, 2 steps each) into a fresh SQLite store (or uses
``--store URL``), serves the dashboard and drives Debian's Chromium with Playwright::

    uv run --frozen --no-sync python scripts/dashboard_screenshots.py [--store sqlite:///runs.db]
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "dashboard"))

from dashboard_helpers import DashboardThread, train_tiny_runs  # noqa: E402
from playwright.sync_api import sync_playwright  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", help="an existing store (default: train two tiny runs into a new one)")
    parser.add_argument("--out", default=str(REPO / "docs" / "img"))
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="agentbolt-shots-"))
    url = args.store
    if url is None:
        url = f"sqlite:///{tmp}/store.db"
        train_tiny_runs(url, tmp / "out")
    db = url.removeprefix("sqlite:///")
    rollout = (
        sqlite3.connect(db)
        .execute(
            "SELECT rollout_id FROM rollouts WHERE mode = 'train' AND status = 'succeeded' ORDER BY id DESC LIMIT 1"
        )
        .fetchone()[0]
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with DashboardThread(url) as dash, sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path="/usr/bin/chromium", headless=True, args=["--no-sandbox", "--disable-gpu"]
        )
        page = browser.new_page(viewport={"width": 1360, "height": 900}, device_scale_factor=1)
        page.goto(f"{dash.url}/runs")
        for box in page.locator("input.pick").all():
            box.check()
        page.select_option("#compare-metric", "train/reward")
        page.wait_for_selector("#compare-chart .uplot")
        page.screenshot(path=out / "dashboard-runs.png", full_page=True)
        run_id = page.locator("#runs-table tbody tr").first.get_attribute("data-run")
        page.goto(f"{dash.url}/runs/{run_id}")
        page.wait_for_selector("#steps-table tbody tr")
        page.screenshot(path=out / "dashboard-run.png", full_page=True)
        page.goto(f"{dash.url}/rollouts?run={run_id}&mode=train")
        page.screenshot(path=out / "dashboard-rollouts.png", full_page=True)
        page.goto(f"{dash.url}/rollouts/{rollout}")
        page.screenshot(path=out / "dashboard-trajectory.png", full_page=True)
        page.goto(f"{dash.url}/runs/{run_id}/rewards")
        page.screenshot(path=out / "dashboard-rewards.png", full_page=True)
        page.goto(f"{dash.url}/health")
        page.screenshot(path=out / "dashboard-health.png", full_page=True)
        browser.close()
    print(f"screenshots of {url} in {out}")


if __name__ == "__main__":
    main()
