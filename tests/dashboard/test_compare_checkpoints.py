"""Two checkpoints on the same held-out questions (``/runs/<id>/compare``): the counts of improved,
regressed, both right and both wrong agree with the run's held-out accuracy at both steps (the
summary card's figures and the store's own rows), over every pair of evaluations of every run of a
store of real tiny-model training runs; and in Chromium, the page shows those counts, restores
its filter from the URL and fits 390 px."""

from __future__ import annotations

import itertools
import json
import shutil
import sqlite3
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from dashboard_helpers import DashboardThread, sql
from test_dashboard_views import off_loop

from agentbolt.cli.runs import open_existing_store
from agentbolt.runs.summary import run_summary

THRESHOLD = 1.0  # torch-grpo's success_threshold, recorded in the run's config


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url) as response:
        return json.load(response)


def store_truth(store_db: Path, run_id: str, a: int, b: int) -> dict[str, int]:
    """The changes between steps a and b counted straight from the store's rows (the oracle)."""
    rows = sql(
        store_db,
        "SELECT task_id, step, status = 'succeeded' AND final_reward >= ? FROM rollouts "
        "WHERE run_id = ? AND mode = 'val' AND step IN (?, ?) AND status IN ('succeeded', 'failed', 'cancelled')",
        THRESHOLD,
        run_id,
        a,
        b,
    )
    right = {(task, step): bool(ok) for task, step, ok in rows}
    tasks = {task for task, _ in right}
    out = {"improved": 0, "regressed": 0, "both-right": 0, "both-wrong": 0}
    for task in tasks:
        ra, rb = right[(task, a)], right[(task, b)]
        out["both-right" if ra and rb else "both-wrong" if not (ra or rb) else "improved" if rb else "regressed"] += 1
    return out


async def card_accuracy(store_url: str, run_id: str) -> dict[int, tuple[int, int]]:
    """The summary card's held-out accuracy per evaluation step, as (right, n)."""
    store = open_existing_store(store_url)
    try:
        card = await run_summary(store, run_id, findings=False)
    finally:
        await store.close()
    (accuracy,) = [h for h in card.heldout if h.metric == "accuracy"]
    return {e.step: (round(e.mean * e.n), e.n) for e in accuracy.evaluations}


def assert_counts_agree(dashboard: DashboardThread, store_url: str, store_db: Path) -> None:
    """Over the session store's two runs and every (A, B) pair of their evaluations: the counts are the store's, and add
    up to the summary card's held-out accuracy at A and at B."""
    # the session store's own two runs (tests that run earlier may add runs of their own after them)
    runs = [r for (r,) in sql(store_db, "SELECT run_id FROM runs ORDER BY id LIMIT 2")]
    assert len(runs) == 2
    for run_id in runs:
        accuracy = off_loop(card_accuracy(store_url, run_id))
        steps = sorted(accuracy)
        assert len(steps) >= 2, "the fixture evaluates every step"
        default = get_json(f"{dashboard.url}/api/runs/{run_id}/compare")
        assert (default["a"]["step"], default["b"]["step"]) == (steps[0], steps[-1])  # first -> last
        for a, b in itertools.product(steps, repeat=2):
            got = get_json(f"{dashboard.url}/api/runs/{run_id}/compare?a={a}&b={b}")
            counts = got["counts"]
            assert counts["unpaired"] == 0  # every evaluation asked every held-out question
            assert {k: v for k, v in counts.items() if k != "unpaired"} == store_truth(store_db, run_id, a, b)
            assert (got["a"]["right"], got["a"]["n"]) == accuracy[a]
            assert (got["b"]["right"], got["b"]["n"]) == accuracy[b]
            assert counts["both-right"] + counts["regressed"] == accuracy[a][0]
            assert counts["both-right"] + counts["improved"] == accuracy[b][0]
            assert sum(counts.values()) == accuracy[a][1] == accuracy[b][1]
            if a == b:
                assert counts["improved"] == counts["regressed"] == 0


def test_the_counts_agree_with_the_held_out_accuracy_at_both_steps(
    dashboard: DashboardThread, tiny_store: str, store_db: Path
) -> None:
    assert_counts_agree(dashboard, tiny_store, store_db)


def test_every_change_is_counted_where_the_store_has_one(store_db: Path, tmp_path: Path) -> None:
    """The tiny random model is rarely right, so a copy of the store is given one question fixed
    and one broken between the first and last evaluation, and a failed rollout that reported
    reward 1 (it counts as wrong, as on the card)."""
    db = tmp_path / "store.db"
    shutil.copy(store_db, db)
    (run_id,) = sql(db, "SELECT run_id FROM runs ORDER BY id LIMIT 1")[0]
    steps = [s for (s,) in sql(db, "SELECT DISTINCT step FROM rollouts WHERE run_id = ? AND mode = 'val'", run_id)]
    first, last = min(steps), max(steps)
    fixed, broken = sorted(
        {t for (t,) in sql(db, "SELECT task_id FROM rollouts WHERE run_id = ? AND mode = 'val'", run_id)}
    )
    with sqlite3.connect(db) as conn:
        update = "UPDATE rollouts SET status = ?, final_reward = ? WHERE run_id = ? AND mode = 'val' AND task_id = ? AND step = ?"
        conn.execute(update, ("succeeded", 0.0, run_id, fixed, first))
        conn.execute(update, ("succeeded", 1.0, run_id, fixed, last))
        conn.execute(update, ("succeeded", 1.0, run_id, broken, first))
        conn.execute(update, ("failed", 1.0, run_id, broken, last))
    with DashboardThread(f"sqlite:///{db}") as dashboard:
        got = get_json(f"{dashboard.url}/api/runs/{run_id}/compare")
        assert got["counts"] == {"improved": 1, "regressed": 1, "both-right": 0, "both-wrong": 0, "unpaired": 0}
        assert_counts_agree(dashboard, f"sqlite:///{db}", db)
        # the failed rollout's trajectory says wrong too (one rule: HeldoutMetric.correct)
        (failed,) = sql(
            db, "SELECT rollout_id FROM rollouts WHERE run_id = ? AND task_id = ? AND step = ?", run_id, broken, last
        )[0]
        with urllib.request.urlopen(f"{dashboard.url}/rollouts/{failed}") as response:
            page = response.read().decode()
        assert 'id="verdict" data-correct="no"' in page and "✗ wrong (accuracy)" in page


def test_bad_steps_and_filters_are_clear_errors(dashboard: DashboardThread, store_db: Path) -> None:
    (run_id,) = sql(store_db, "SELECT run_id FROM runs ORDER BY id LIMIT 1")[0]
    for query, says in (
        ("a=99", "no evaluation step"),
        ("b=x", "must be an evaluation step"),
        ("filter=better", "filter must be one of"),
    ):
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(f"{dashboard.url}/runs/{run_id}/compare?{query}")
        assert caught.value.code == 400
        assert says in caught.value.read().decode()


def test_the_page_shows_the_counts_restores_the_filter_and_fits_390_px(
    dashboard: DashboardThread, browser: Any, store_db: Path
) -> None:
    (run_id,) = sql(store_db, "SELECT run_id FROM runs ORDER BY id LIMIT 1")[0]
    context = browser.new_context(viewport={"width": 390, "height": 844})
    page = context.new_page()
    page.set_default_timeout(15_000)
    try:
        page.goto(f"{dashboard.url}/runs/{run_id}")
        page.locator("#compare-link a").click()
        page.wait_for_url("**/compare")
        record = get_json(f"{dashboard.url}/api/runs/{run_id}/compare")
        shown = {
            a.get_attribute("data-filter"): int(a.locator("[data-count]").inner_text())
            for a in page.locator("#compare-filters a").all()
        }
        assert shown == {"all": record["a"]["n"], **{k: v for k, v in record["counts"].items() if k != "unpaired"}}
        for side in ("a", "b"):
            tile = page.locator(f'#compare-accuracy [data-side="{side}"]')
            assert int(tile.locator('[data-value="right"]').inner_text()) == record[side]["right"]
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        # each reply links the trajectory of its sample at that step
        (first_reply,) = page.locator("#compare-rows li").first.locator('[data-side="b"] a.cmp-reply').all()
        (step,) = sql(
            store_db,
            "SELECT step FROM rollouts WHERE rollout_id = ?",
            first_reply.get_attribute("href").removeprefix("/rollouts/"),
        )[0]
        assert step == record["b"]["step"]
        # choose a filter: its rows only, and the URL keeps it (with the steps) across a reload
        chosen = next(k for k, n in shown.items() if k != "all" and n > 0)
        page.locator(f'#compare-filters a[data-filter="{chosen}"]').click()
        page.wait_for_url(f"**filter={chosen}")
        url = page.url
        assert f"a={record['a']['step']}" in url and f"b={record['b']['step']}" in url
        page.goto(url)
        assert page.locator("#compare-filters a.on").get_attribute("data-filter") == chosen
        changes = [li.get_attribute("data-change") for li in page.locator("#compare-rows li.cmp-row").all()]
        assert changes == [chosen] * shown[chosen]
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        # the held-out trajectory links back to the comparison
        (held_out,) = sql(
            store_db,
            "SELECT rollout_id FROM rollouts WHERE run_id = ? AND mode = 'val' ORDER BY id DESC LIMIT 1",
            run_id,
        )[0]
        page.goto(f"{dashboard.url}/rollouts/{held_out}")
        page.locator("#compare-link a").click()
        page.wait_for_url("**/compare**")
        assert page.locator("#compare-rows li.cmp-row").count() == record["a"]["n"]
    finally:
        context.close()
