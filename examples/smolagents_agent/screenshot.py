"""Screenshot the dashboard's trajectory page of one training rollout of a smolagents_agent run.

    uv run python examples/smolagents_agent/screenshot.py [--store sqlite:///runs/smolagents_agent.db]
    uv run python examples/smolagents_agent/scripted.py && \
        uv run python examples/smolagents_agent/screenshot.py --store sqlite:///runs/smolagents_scripted.db

Picks the latest training rollout (any rollout, for a ``scripted.py`` store) in which both agents
ran (else the latest one), serves the dashboard on 127.0.0.1 and drives Debian's Chromium with Playwright
(``/usr/bin/chromium``; never a downloaded browser). Writes ``trajectory.png`` next to this file
and prints the rollout it shows.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "tests" / "dashboard"))

from dashboard_helpers import DashboardThread  # noqa: E402
from playwright.sync_api import sync_playwright  # noqa: E402

from agentbolt.store import open_store  # noqa: E402


async def pick_rollout(store_url: str) -> str:
    store = open_store(store_url)
    try:
        everything = (await store.query_rollouts(limit=100_000)).items
        rollouts = [r for r in everything if r.mode.value == "train"] or everything
        spans = await store.query_spans([r.rollout_id for r in rollouts], latest_attempt_only=True)
    finally:
        await store.close()
    if not rollouts:
        raise SystemExit(f"{store_url}: no rollouts")

    def agents(rollout_id: str) -> set[str]:
        return {
            str(s.attributes.get("gen_ai.agent.name"))
            for s in spans[rollout_id]
            if s.attributes.get("agentbolt.span.kind") == "agent"
        }

    both = [r for r in rollouts if {"manager", "solver"} <= agents(r.rollout_id)]
    return (both or rollouts)[-1].rollout_id


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default="sqlite:///runs/smolagents_agent.db")
    parser.add_argument("--out", default=str(HERE / "trajectory.png"))
    args = parser.parse_args()
    rollout = asyncio.run(pick_rollout(args.store))
    with DashboardThread(args.store) as dash, sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path="/usr/bin/chromium", headless=True, args=["--no-sandbox", "--disable-gpu"]
        )
        page = browser.new_page(viewport={"width": 1360, "height": 900}, device_scale_factor=1)
        page.goto(f"{dash.url}/rollouts/{rollout}")
        # The span tree, the transitions and the rewards (the LLM calls' details follow below them).
        page.screenshot(path=args.out, full_page=True, clip={"x": 0, "y": 0, "width": 1360, "height": 1160})
        browser.close()
    print(f"trajectory of rollout {rollout} in {args.out}")


if __name__ == "__main__":
    main()
