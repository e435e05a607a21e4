"""The dashboard in Chromium, against a store filled by real tiny-model training runs."""

from __future__ import annotations

import asyncio
import concurrent.futures
import re
from pathlib import Path
from typing import Any

import httpx
from dashboard_helpers import DashboardThread, sql

from agentbolt.store import RunSpec, open_store


def off_loop(coro: Any) -> Any:
    """Run a coroutine on its own thread (Playwright's sync API owns this thread's loop)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def test_every_page_loads(dashboard: DashboardThread, page: Any, store_db: Path) -> None:
    # the fixture's two runs come first (other tests may add runs to the session's store later)
    runs = sql(store_db, "SELECT run_id, name FROM runs ORDER BY id LIMIT 2")
    assert len(runs) == 2
    page.goto(f"{dashboard.url}/")
    assert page.url.endswith("/runs")
    for run_id, name in runs:
        row = page.locator(f'tr[data-run="{run_id}"]')
        assert name in row.inner_text() and "succeeded" in row.inner_text()
        assert row.locator('[data-field="steps"]').inner_text() == "2"
    run_id = runs[0][0]
    response = page.goto(f"{dashboard.url}/runs/{run_id}")
    assert response.status == 200
    page.wait_for_selector("#chart-grid .uplot")
    steps = page.locator("#steps-table tbody tr")
    assert steps.count() == len(
        sql(store_db, "SELECT 1 FROM run_metrics JOIN runs ON runs.id = run_key WHERE run_id = ?", run_id)
    )
    for path, marker in [
        ("/rollouts", "#rollouts-table"),
        (f"/runs/{run_id}/rewards", "#top-advantages"),
        ("/health", "#fidelity"),
    ]:
        response = page.goto(dashboard.url + path)
        assert response.status == 200, path
        assert page.locator(marker).count() == 1
    (total,) = sql(store_db, "SELECT COUNT(*) FROM rollouts WHERE run_id IN (?, ?)", runs[0][0], runs[1][0])[0]
    page.goto(f"{dashboard.url}/health")
    assert page.locator("#fidelity").inner_text().split()[1] == str(
        sql(store_db, 'SELECT COUNT(*) FROM spans WHERE body LIKE \'%"agentbolt.llm.token_source":"exact"%\'')[0][0]
    )
    assert total == 2 * (2 * 2 * 4 + 3 * 2)  # per run: 2 steps x 2 tasks x 4 samples + 3 held-out evaluations x 2 tasks


def test_rollouts_filter(dashboard: DashboardThread, page: Any, store_db: Path) -> None:
    run_id = sql(store_db, "SELECT run_id FROM runs ORDER BY id LIMIT 1")[0][0]
    page.goto(f"{dashboard.url}/rollouts")
    page.select_option("select[name=run]", run_id)
    page.fill("input[name=step]", "2")
    page.select_option("select[name=mode]", "train")
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r"step=2"))
    rows = page.locator("#rollouts-table tbody tr")
    expected = sql(store_db, "SELECT rollout_id FROM rollouts WHERE run_id = ? AND step = 2 AND mode = 'train'", run_id)
    assert rows.count() == len(expected) == 8
    shown = {rows.nth(i).locator("td").first.inner_text() for i in range(rows.count())}
    assert shown == {r for (r,) in expected}
    assert "8 matching" in page.locator("h1").inner_text()
    # the mode in the words of the rest of the dashboard: training / held-out (the store's val)
    assert set(page.locator("#rollouts-table tbody td:nth-child(5)").all_inner_texts()) == {"training"}
    assert page.locator("select[name=mode] option[value=val]").inner_text() == "held-out (val)"

    page.fill("input[name=q]", "add-1")
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r"q=add-1"))
    tasks = {page.locator("#rollouts-table tbody tr td:nth-child(2)").nth(i).inner_text() for i in range(rows.count())}
    assert tasks <= {"add-1"} and rows.count() == len(
        sql(
            store_db,
            "SELECT 1 FROM rollouts WHERE run_id = ? AND step = 2 AND mode = 'train' AND task_id = 'add-1'",
            run_id,
        )
    )

    page.goto(f"{dashboard.url}/rollouts?reward_min=0.75")
    rewards = [float(x) for x in page.locator("#rollouts-table tbody td:nth-child(7)").all_inner_texts()]
    assert all(r >= 0.75 for r in rewards)
    assert len(rewards) == min(50, sql(store_db, "SELECT COUNT(*) FROM rollouts WHERE final_reward >= 0.75")[0][0])


def test_a_trajectory_shows_token_ids_and_transitions(dashboard: DashboardThread, page: Any, store_db: Path) -> None:
    run_id = sql(store_db, "SELECT run_id FROM runs ORDER BY id LIMIT 1")[0][0]
    page.goto(f"{dashboard.url}/rollouts?run={run_id}&mode=train&status=succeeded")
    link = page.locator("#rollouts-table tbody tr td a").first
    rollout_id = link.inner_text()
    link.click()
    page.wait_for_selector("#transitions")
    assert rollout_id in page.locator("h1").inner_text()
    body = sql(
        store_db,
        "SELECT spans.body FROM spans JOIN rollouts ON rollouts.id = spans.rkey WHERE rollout_id = ? "
        "AND spans.body LIKE '%response_token_ids%'",
        rollout_id,
    )[0][0]
    ids = re.search(r'"agentbolt\.llm\.response_token_ids":\[([0-9,]*)\]', body).group(1).split(",")
    tokens = [t.get_attribute("data-id") for t in page.locator(".tokens .tok").all()]
    assert tokens == ids  # the call's response tokens, in order, each with its probability on hover
    assert page.locator(".tokens .tok").first.get_attribute("title").startswith("p 0.")
    row = page.locator("#transitions table tbody tr").first
    cells = row.locator("td").all_inner_texts()
    assert cells[-1] == "trained" and cells[7] == "exact"
    assert re.fullmatch(r"-?\d+(\.\d+)?(e-?\d+)?", cells[6]), cells  # an advantage from LightningRL
    assert "You are a careful calculator" in page.locator(".call .chat").first.text_content()  # collapsed


def test_a_held_out_trajectory_is_never_marked_trained(dashboard: DashboardThread, page: Any, store_db: Path) -> None:
    run_id = sql(store_db, "SELECT run_id FROM runs ORDER BY id LIMIT 1")[0][0]
    page.goto(f"{dashboard.url}/rollouts?run={run_id}&mode=val&status=succeeded")
    page.locator("#rollouts-table tbody tr td a").first.click()
    page.wait_for_selector("#transitions")
    assert "held-out (validation) rollout" in page.locator("#held-out-note").inner_text()
    rows = page.locator("#transitions table").first.locator("tbody tr")  # the calls (rewards follow)
    assert rows.count() >= 1
    for i in range(rows.count()):
        cells = rows.nth(i).locator("td").all_inner_texts()
        assert cells[-1] == "held-out: never trained" and cells[6] == "\u2013", cells  # no advantage either
    assert page.locator("#transitions .ok").count() == 0


def test_the_run_page_shows_training_health(dashboard: DashboardThread, page: Any, store_db: Path) -> None:
    run_id = sql(store_db, "SELECT run_id FROM runs ORDER BY id LIMIT 1")[0][0]
    page.goto(f"{dashboard.url}/runs/{run_id}")
    card = page.locator("#training-health")
    head = page.locator("#health-table thead").text_content()
    assert "steps 1" in head and "steps 2" in head
    text = " ".join(card.text_content().split())
    assert "training reward" in text and "held-out reward (2 tasks paired, steps 0 and 2" in text
    assert "sampled tokens with p ≥ 0.99" in text and "samples repeating one of their group" in text
    shown = {x.get_attribute("data-code") for x in page.locator("#health-findings li").all()}
    status = page.locator("#health-status").inner_text()
    assert status == "ok" or (status.endswith(("warning", "warnings")) and shown)


def test_two_runs_compare_on_one_chart(dashboard: DashboardThread, page: Any, store_db: Path) -> None:
    runs = sql(store_db, "SELECT run_id, name FROM runs ORDER BY id LIMIT 2")  # the fixture's (others may follow)
    names = [name for _, name in runs]
    page.goto(f"{dashboard.url}/runs")
    for run_id, _ in runs:
        page.locator(f"tr[data-run='{run_id}'] input.pick").check()
    page.select_option("#compare-metric", "update/loss")
    page.wait_for_selector("#compare-chart .uplot")
    legend = page.locator("#compare-chart .u-legend").inner_text()
    assert all(name in legend for name in names)
    assert page.locator("#compare-chart").get_attribute("data-points") == "2"  # steps 1 and 2
    assert page.locator("#compare-hint").inner_text() == "2 runs"


def test_a_new_step_appears_without_reload(dashboard: DashboardThread, page: Any, tiny_store: str) -> None:
    async def start() -> str:
        store = open_store(tiny_store)
        try:
            run = await store.start_run(RunSpec(name="live", algorithm="torch-grpo", model="tiny"))
            await store.add_run_metrics(run.run_id, 1, {"train/reward": 0.25})
            return run.run_id
        finally:
            await store.close()

    async def add_step(run_id: str) -> None:
        store = open_store(tiny_store)
        try:
            await store.add_run_metrics(run_id, 2, {"train/reward": 0.75})
        finally:
            await store.close()

    run_id = off_loop(start())
    page.goto(f"{dashboard.url}/runs/{run_id}")
    page.wait_for_selector('#steps-table tr[data-step="1"]')
    page.evaluate("window.__sameDocument = true")
    off_loop(add_step(run_id))
    page.wait_for_selector('#steps-table tr[data-step="2"]')  # polled in, no reload
    assert page.evaluate("window.__sameDocument") is True
    assert page.locator("#run-steps").inner_text() == "2"
    page.wait_for_function(
        "document.querySelector('#chart-grid [data-chart=\"train/reward\"] .plot')?.dataset.points === '2'"
    )


def test_unknown_ids_are_404_pages_and_the_dashboard_is_read_only(dashboard: DashboardThread, page: Any) -> None:
    for path in ("/runs/run-nope", "/rollouts/ro-nope", "/runs/run-nope/rewards", "/nowhere"):
        response = page.goto(dashboard.url + path)
        assert response.status == 404, path
        assert "Not found" in page.locator("h1").inner_text()
    assert httpx.post(f"{dashboard.url}/runs").status_code == 405
    assert httpx.get(f"{dashboard.url}/rollouts?reward_min=abc").status_code == 400


def test_a_token_protects_the_dashboard(tiny_store: str, page: Any) -> None:
    with DashboardThread(tiny_store, token="s3cret") as dash:
        assert httpx.get(f"{dash.url}/runs").status_code == 401
        assert httpx.get(f"{dash.url}/runs", headers={"authorization": "Bearer s3cret"}).status_code == 200
        response = page.goto(f"{dash.url}/runs?token=s3cret")  # sets a cookie, then plain URLs work
        assert response.status == 200 and page.url.endswith("/runs")
        assert page.goto(f"{dash.url}/health").status == 200


def test_the_dashboard_reads_a_store_server(tiny_store: str, page: Any, store_db: Path) -> None:
    from agentbolt.store.server import ServerThread

    server = ServerThread(open_store(tiny_store, sweep_interval_s=0), close_store=True).start()
    try:
        with DashboardThread(server.url) as dash:
            run_id, name = sql(store_db, "SELECT run_id, name FROM runs ORDER BY id LIMIT 1")[0]
            page.goto(f"{dash.url}/runs")
            assert name in page.locator(f'tr[data-run="{run_id}"]').inner_text()
            page.goto(f"{dash.url}/rollouts?run={run_id}&mode=train&status=succeeded")
            page.locator("#rollouts-table tbody tr td a").first.click()
            page.wait_for_selector(".tokens .tok")
            assert page.locator("#transitions table tbody tr").first.locator("td").last.inner_text() == "trained"
            assert page.goto(f"{dash.url}/rollouts/ro-nope").status == 404
    finally:
        server.stop()


def test_policies_by_role_get_one_curve_per_policy(dashboard: DashboardThread, page: Any, tiny_store: str) -> None:
    """A run with policies by role records them in its config; its run page and the compare view
    draw a per-policy metric family (``train/{policy}/loss``) as one curve per policy."""
    policies = {"writer": {"match": ["write_query"]}, "rewriter": {"match": ["rewrite_query"]}}

    async def record(name: str, scale: float) -> str:
        store = open_store(tiny_store)
        try:
            spec = RunSpec(name=name, algorithm="torch-grpo", model="tiny", config={"policies": policies})
            run = await store.start_run(spec)
            for step in (1, 2, 3):
                values = {"train/reward": 0.1 * step, "train/writer/loss": scale * step, "train/rewriter/loss": -step}
                await store.add_run_metrics(run.run_id, step, values)
            return run.run_id
        finally:
            await store.close()

    first, second = off_loop(record("roles-a", 1.0)), off_loop(record("roles-b", 2.0))
    page.goto(f"{dashboard.url}/runs/{first}")
    page.locator("details.picker summary").click()
    page.locator("input.chart-pick[value='train/{policy}/loss']").check()
    panel = "#chart-grid [data-chart='train/{policy}/loss']"
    page.wait_for_function(f"(document.querySelector(\"{panel} .u-legend\") || {{}}).innerText?.includes('rewriter')")
    legend = page.locator(f"{panel} .u-legend").inner_text()
    assert "writer" in legend and "rewriter" in legend
    assert page.locator(f"{panel} .plot").get_attribute("data-points") == "3"
    assert "loss per policy" in page.locator(f"{panel} h3").inner_text()

    page.goto(f"{dashboard.url}/runs")
    for run_id in (first, second):
        page.locator(f"tr[data-run='{run_id}'] input.pick").check()
    page.select_option("#compare-metric", "train/{policy}/loss")
    page.wait_for_selector("#compare-chart .uplot")
    page.wait_for_function(
        "(document.querySelector('#compare-chart .u-legend') || {}).innerText?.includes('roles-b · rewriter')"
    )
    legend = page.locator("#compare-chart .u-legend").inner_text()
    for label in ("roles-a · writer", "roles-a · rewriter", "roles-b · writer", "roles-b · rewriter"):
        assert label in legend, legend
