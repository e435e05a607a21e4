"""The run page's summary card, chart grid and URL; the trajectory's first screen; the reward view;
no horizontal overflow at 390 px — in Chromium, against a store of real tiny-model training runs."""

from __future__ import annotations

import asyncio
import concurrent.futures
from pathlib import Path
from typing import Any

import pytest
from dashboard_helpers import DashboardThread, sql

from agentbolt.runs.evaluation import read_heldout, set_score


def off_loop(coro: Any) -> Any:
    """Run a coroutine on its own thread (Playwright's sync API owns this thread's loop)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def first_run(store_db: Path) -> str:
    return sql(store_db, "SELECT run_id FROM runs ORDER BY id LIMIT 1")[0][0]


def test_the_summary_card_equals_the_runs_held_out_record(
    dashboard: DashboardThread, page: Any, tiny_store: str, store_db: Path
) -> None:
    """Before -> after, standard errors and n on the card are the figures the run record publishes
    (read_heldout + set_score, as the quickstart writes result.json)."""
    run_id = first_run(store_db)
    steps = [
        s for (s,) in sql(store_db, "SELECT DISTINCT step FROM rollouts WHERE run_id = ? AND mode = 'val'", run_id)
    ]
    first, last = f"val{min(steps)}", f"val{max(steps)}"
    outcomes = off_loop(read_heldout(tiny_store, [first, last], run_id=run_id, spans=False))
    for metric, score in (("accuracy", lambda o: float(o.score() >= 1.0)), ("reward", lambda o: o.score())):
        record = set_score(metric, [score(o) for o in outcomes[first]], [score(o) for o in outcomes[last]])
        page.goto(f"{dashboard.url}/runs/{run_id}")
        tile = page.locator(f'#summary-card [data-figure="{metric}"]')
        assert tile.locator("span").first.inner_text().lower() == f"held-out {metric}"
        shown = {
            k: tile.locator(f'[data-value="{k}"]').inner_text()
            for k in ("before", "after", "before_se", "after_se", "n")
        }
        assert shown == {
            "before": f"{record.before:.3f}",
            "after": f"{record.after:.3f}",
            "before_se": f"{record.before_se:.3f}",
            "after_se": f"{record.after_se:.3f}",
            "n": str(record.n),
        }
    # the strictest metric leads; findings are counted on the card and listed beside the charts
    assert page.locator("#summary-card .tile").first.get_attribute("data-figure") == "accuracy"
    listed = page.locator("#health-findings li[data-code]").count()
    assert page.locator('#summary-card [data-figure="findings"] [data-value="value"]').inner_text() == str(listed)


def test_the_runs_list_shows_the_held_out_figure_with_se_and_the_findings(
    dashboard: DashboardThread, page: Any, tiny_store: str, store_db: Path
) -> None:
    """Each row of /runs: held-out accuracy first -> last evaluation (labelled, ± se, n), as the run
    record publishes it, and the run's findings by code, the ones its run page lists."""
    run_id = first_run(store_db)
    steps = [
        s for (s,) in sql(store_db, "SELECT DISTINCT step FROM rollouts WHERE run_id = ? AND mode = 'val'", run_id)
    ]
    first, last = f"val{min(steps)}", f"val{max(steps)}"
    outcomes = off_loop(read_heldout(tiny_store, [first, last], run_id=run_id, spans=False))
    record = set_score(
        "accuracy",
        [float(o.score() >= 1.0) for o in outcomes[first]],
        [float(o.score() >= 1.0) for o in outcomes[last]],
    )
    page.goto(f"{dashboard.url}/runs/{run_id}")
    codes = sorted(x.get_attribute("data-code") for x in page.locator("#health-findings li[data-code]").all())
    page.goto(f"{dashboard.url}/runs")
    row = page.locator(f'#runs-table tr[data-run="{run_id}"]')
    cell = " ".join(row.locator('[data-field="heldout"]').inner_text().split())
    assert cell == (
        f"held-out accuracy {record.before:.3f} → {record.after:.3f} ± {record.after_se:.3f} se, n={record.n}"
    )
    findings = row.locator('[data-field="findings"]')
    assert sorted(a.inner_text() for a in findings.locator("a").all()) == codes
    assert "mean last" in page.locator("#runs-table thead").inner_text()  # the reward says what it is


def test_the_held_out_charts_come_first_with_se_bands(dashboard: DashboardThread, page: Any, store_db: Path) -> None:
    run_id = first_run(store_db)
    page.goto(f"{dashboard.url}/runs/{run_id}")
    page.wait_for_selector("#chart-grid .panel .uplot")
    panels = [p.get_attribute("data-chart") for p in page.locator("#chart-grid .panel").all()]
    assert panels[:2] == ["heldout:accuracy", "heldout:reward"] and "train/reward" in panels
    evaluations = sql(store_db, "SELECT COUNT(DISTINCT step) FROM rollouts WHERE run_id = ? AND mode = 'val'", run_id)[
        0
    ][0]
    first = page.locator('#chart-grid [data-chart="heldout:accuracy"]')
    assert first.locator(".plot").get_attribute("data-points") == str(evaluations)
    (n,) = sql(store_db, "SELECT COUNT(*) FROM rollouts WHERE run_id = ? AND mode = 'val' AND step = 0", run_id)[0]
    assert f"n={n} per evaluation" in first.locator("h3").inner_text()
    assert "+ 1 se" in first.locator(".u-legend").inner_text()


def test_the_url_restores_the_chosen_charts_and_smoothing(
    dashboard: DashboardThread, page: Any, store_db: Path
) -> None:
    run_id = first_run(store_db)
    page.goto(f"{dashboard.url}/runs/{run_id}")
    page.wait_for_selector("#chart-grid .panel")
    page.locator("details.picker summary").click()
    page.locator("input.chart-pick[value='update/loss']").uncheck()
    page.locator("input.chart-pick[value='heldout:reward']").uncheck()
    page.locator("#smooth").fill("0.6")
    chosen = page.locator("#chart-grid").get_attribute("data-charts")
    assert "update/loss" not in chosen and "heldout:reward" not in chosen and "heldout:accuracy" in chosen
    url = page.url
    assert f"charts={chosen}" in url and "smooth=0.6" in url
    page.goto("about:blank")
    page.goto(url)  # a fresh load of the link restores the view
    page.wait_for_selector("#chart-grid .panel")
    assert page.locator("#chart-grid").get_attribute("data-charts") == chosen
    assert page.locator("#smooth").input_value() == "0.6"
    assert page.locator("input.chart-pick[value='update/loss']").is_checked() is False
    assert "smoothed 0.6" in page.locator('#chart-grid [data-chart="train/reward"] .u-legend').inner_text()


def test_a_trajectorys_first_screen_answers_and_the_verdict_matches_the_reward(
    dashboard: DashboardThread, page: Any, store_db: Path
) -> None:
    run_id = first_run(store_db)
    rows = sql(
        store_db,
        "SELECT rollout_id, final_reward, json_extract(input, '$.question'), json_extract(input, '$.answer'), group_id "
        "FROM rollouts WHERE run_id = ? AND status = 'succeeded' AND mode = 'train' ORDER BY id LIMIT 8",
        run_id,
    )
    assert rows
    for rollout_id, reward, question, answer, group_id in rows:
        page.goto(f"{dashboard.url}/rollouts/{rollout_id}")
        for field in ("#answer-question", "#answer-reply", "#answer-expected", "#verdict"):
            box = page.locator(field).bounding_box()
            assert box is not None and box["y"] + box["height"] <= 900, field  # on the first screen at 1360 x 900
        assert page.locator("#answer-question").inner_text() == question
        assert page.locator("#answer-expected").inner_text() == str(answer)
        verdict = page.locator("#verdict")
        assert verdict.get_attribute("data-correct") == ("yes" if reward >= 1.0 else "no")
        assert ("✓" if reward >= 1.0 else "✗") in verdict.inner_text() and f"reward {reward:g}" in verdict.inner_text()
        siblings = sql(
            store_db, "SELECT rollout_id FROM rollouts WHERE group_id = ? AND rollout_id != ?", group_id, rollout_id
        )
        links = {a.get_attribute("href") for a in page.locator("#group-samples a").all()}
        assert links == {f"/rollouts/{r}" for (r,) in siblings}
        assert "adv " in page.locator("#group-samples").inner_text()  # training samples show their advantage


def test_the_reward_view_shows_values_and_keeps_held_out_apart(
    dashboard: DashboardThread, page: Any, store_db: Path
) -> None:
    run_id = first_run(store_db)
    page.goto(f"{dashboard.url}/runs/{run_id}/rewards")
    training = page.locator("#rewards-training")
    bars = training.locator('.hist[data-name="final"] .hbar')
    values = sorted(
        {
            r
            for (r,) in sql(
                store_db,
                "SELECT final_reward FROM rollouts WHERE run_id = ? AND mode = 'train' AND status = 'succeeded'",
                run_id,
            )
        }
    )
    assert [float(b.get_attribute("data-value")) for b in bars.all()] == pytest.approx(values)  # one bar per value
    n_train = sql(
        store_db, "SELECT COUNT(*) FROM rollouts WHERE run_id = ? AND mode = 'train' AND status = 'succeeded'", run_id
    )[0][0]
    assert sum(int(b.locator(".n").inner_text()) for b in bars.all()) == n_train
    assert "held-out" in page.locator("#rewards-held-out h2").inner_text()
    for step, zero in [
        (r.get_attribute("data-step"), r.locator('[data-field="zero"]').inner_text())
        for r in page.locator("#zero-spread tbody tr").all()
    ]:
        groups = sql(
            store_db,
            "SELECT COUNT(DISTINCT final_reward) FROM rollouts WHERE run_id = ? AND mode = 'train' AND step = ? GROUP BY group_id",
            run_id,
            int(step),
        )
        assert int(zero) == sum(1 for (k,) in groups if k == 1)


@pytest.mark.parametrize("path", ["/runs", "/runs/{run}", "/rollouts/{rollout}", "/runs/{run}/rewards", "/rollouts"])
def test_no_horizontal_overflow_at_390_px(dashboard: DashboardThread, browser: Any, store_db: Path, path: str) -> None:
    run_id = first_run(store_db)
    (rollout_id,) = sql(
        store_db, "SELECT rollout_id FROM rollouts WHERE run_id = ? AND mode = 'train' LIMIT 1", run_id
    )[0]
    context = browser.new_context(viewport={"width": 390, "height": 844})
    page = context.new_page()
    try:
        page.goto(dashboard.url + path.format(run=run_id, rollout=rollout_id))
        page.wait_for_load_state("networkidle")
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 390, f"{path}: {width} px wide"
    finally:
        context.close()


def test_the_serving_path_of_a_training_run_is_not_an_error(
    dashboard: DashboardThread, page: Any, store_db: Path
) -> None:
    run_id = first_run(store_db)
    response = page.goto(f"{dashboard.url}/runs/{run_id}/serving")
    assert response.status == 200
    assert "training run" in page.locator("main").inner_text()
    assert page.locator(f'a[href="/runs/{run_id}"]').count() >= 1


def test_a_held_out_question_links_its_sample_at_every_evaluation(
    dashboard: DashboardThread, page: Any, store_db: Path
) -> None:
    """Before/after on the same held-out question: each evaluation's sample, with its verdict."""
    run_id = first_run(store_db)
    rollout_id, task_id = sql(
        store_db,
        "SELECT rollout_id, task_id FROM rollouts WHERE run_id = ? AND mode = 'val' ORDER BY id LIMIT 1",
        run_id,
    )[0]
    expected = sql(
        store_db,
        "SELECT step, rollout_id, final_reward FROM rollouts WHERE run_id = ? AND mode = 'val' AND task_id = ? "
        "ORDER BY step",
        run_id,
        task_id,
    )
    page.goto(f"{dashboard.url}/rollouts/{rollout_id}")
    links = page.locator("#same-question a").all()
    assert [(int(a.get_attribute("data-step")), a.get_attribute("href")) for a in links] == [
        (step, f"/rollouts/{r}") for step, r, _ in expected
    ]
    for a, (_, _, reward) in zip(links, expected, strict=True):
        assert ("✓" if reward >= 1.0 else "✗") in a.inner_text()
