"""Screenshots of every dashboard page into docs/img/dashboard-*.png, at 1360 px and (runs,
a run, a trajectory) at 390 px, a phone's width.

Trains two tiny-model runs (torch-grpo, 2 steps each) into a fresh SQLite store (or uses
``--store URL``, e.g. a short quickstart's), serves the dashboard and drives Debian's Chromium
with Playwright. The screenshots illustrate the pages; their numbers are not results::

    uv run --frozen --no-sync python scripts/dashboard_screenshots.py [--store sqlite:///runs/quickstart.db]
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
            "SELECT rollout_id FROM rollouts WHERE mode = 'train' AND status = 'succeeded' "
            "ORDER BY final_reward >= 1 DESC, id DESC LIMIT 1"  # a right answer, when there is one
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
        page.wait_for_selector("#chart-grid .uplot")
        page.screenshot(path=out / "dashboard-run.png", full_page=True)
        page.goto(f"{dash.url}/rollouts?run={run_id}&mode=train")
        page.screenshot(path=out / "dashboard-rollouts.png", full_page=True)
        page.goto(f"{dash.url}/rollouts/{rollout}")
        page.screenshot(path=out / "dashboard-trajectory.png")  # the first screen: question, reply, verdict
        phone = browser.new_page(viewport={"width": 390, "height": 844}, device_scale_factor=1)
        for name, path in (("runs", "/runs"), ("run", f"/runs/{run_id}"), ("trajectory", f"/rollouts/{rollout}")):
            phone.goto(dash.url + path)
            phone.wait_for_load_state("networkidle")
            width = phone.evaluate("document.documentElement.scrollWidth")
            if width > 390:
                raise SystemExit(f"{path} is {width} px wide at 390 px")
            phone.screenshot(path=out / f"dashboard-{name}-390.png", full_page=name != "run")
        page.goto(f"{dash.url}/runs/{run_id}/rewards")
        page.screenshot(path=out / "dashboard-rewards.png", full_page=True)
        page.goto(f"{dash.url}/health")
        page.screenshot(path=out / "dashboard-health.png", full_page=True)
        browser.close()
    print(f"screenshots of {url} in {out}")


if __name__ == "__main__":
    main()
