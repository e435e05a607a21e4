"""The dashboard's Serving page over a store filled by a real ``agentbolt serve`` session
(``serve_fixture``): its JSON and HTML say what the serve process recorded (sessions with their
calls and rewards, rated / judged / unrated shares, the judge's parse failures, the versions and
the gate's decisions with the reasons of the ledger), and Chromium shows it, at narrow widths too."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from dashboard_helpers import DashboardThread
from serve_fixture import RATED, TOKEN, ServeFacts, fill_serve_store

from agentbolt.online import OnlineServer
from agentbolt.store import RunSpec, open_store
from agentbolt.testing.fake_llm import FakeLLM, FakeLLMServer
from agentbolt_dashboard import create_app


def _off_loop(coro: Any) -> Any:
    """Run a coroutine on its own thread (a Playwright test may own this thread's loop)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


@pytest.fixture(scope="module")
def serve_facts(tmp_path_factory: pytest.TempPathFactory) -> ServeFacts:
    facts: ServeFacts = _off_loop(fill_serve_store(tmp_path_factory.mktemp("serve-store")))
    return facts


@pytest.fixture(scope="module")
def serve_dashboard(serve_facts: ServeFacts) -> Iterator[DashboardThread]:
    with DashboardThread(serve_facts.url) as dash:
        yield dash


def _get(dash: DashboardThread, path: str, **kwargs: Any) -> httpx.Response:
    return httpx.get(dash.url + path, timeout=30, **kwargs)


def test_the_json_says_what_the_serve_process_recorded(
    serve_dashboard: DashboardThread, serve_facts: ServeFacts
) -> None:
    view = _get(serve_dashboard, f"/api/runs/{serve_facts.run_id}/serving").json()
    assert view["run"]["name"] == "capitals assistant" and view["trains"] is True
    assert view["gate"] == {"samples": 1, "z": 2.0, "tolerance": 0.0, "max_failed": 0.5, "tasks": 4}
    assert view["live_version"] == serve_facts.live_version == 3

    sessions = {s["session_id"]: s for s in view["sessions"]}
    assert set(sessions) == {*(f"user-{i}" for i in range(RATED)), "judged", "odd", "open"}
    assert view["sessions_total"] == len(sessions)
    for i in range(RATED):
        s = sessions[f"user-{i}"]
        assert (s["state"], s["calls"], s["feedback"], s["reward"]) == ("closed", 1, "rated", float(i % 2))
    assert sessions["user-1"]["comment"] == "thanks"
    assert (sessions["judged"]["feedback"], sessions["judged"]["reward"]) == ("judged", 0.8)
    assert (sessions["odd"]["state"], sessions["odd"]["feedback"], sessions["odd"]["reward"]) == (
        "closed",
        "awaiting feedback",
        None,
    )
    assert (sessions["open"]["state"], sessions["open"]["feedback"]) == ("open", "awaiting feedback")
    assert sessions["open"]["version"] == 3 and sessions["user-0"]["version"] == 1  # live when each opened

    shown = view["shown"]
    assert (shown["closed"], shown["rated"], shown["judged"], shown["unrated"], shown["open"]) == (
        RATED + 2,
        RATED,
        1,
        1,
        1,
    )
    assert shown["shares"] == {"rated": RATED / 8, "judged": 1 / 8, "unrated": 1 / 8}
    overall = view["overall"]  # the serve process's own counters (its last metrics row, written at stop)
    assert (overall["closed"], overall["rated"], overall["judged"], overall["unrated"], overall["open"]) == (
        8,
        6,
        1,
        1,
        1,
    )

    judge = view["judge"]
    assert judge["configured"] is True and judge["settings"] == {"mode": "rubric", "after_s": 0.0, "max_tries": 1}
    assert (judge["scored"], judge["mean"], judge["judged_all"], judge["mean_all"]) == (1, 0.8, 1, 0.8)
    assert judge["malformed"] == serve_facts.judge_malformed >= 1  # the garbage answer was counted
    assert judge["calls"] == serve_facts.judge_calls and judge["failed"] == 1

    versions = [(v["version"], v["status"]) for v in view["versions"]]
    assert versions == [(3, "live"), (2, "kept out"), (1, "was live")]
    decisions = {d["version"]: d for d in view["decisions"]}
    ledger = {d["version"]: d for d in serve_facts.decisions}
    for version in (2, 3):
        shown_decision, recorded = decisions[version], ledger[version]
        assert shown_decision["passed"] is recorded["passed"]
        assert shown_decision["reason"] == recorded["reason"]  # the ledger's words, rebuilt from the store
        assert shown_decision["delta"] == pytest.approx(recorded["delta"])
        assert shown_decision["candidate_mean"] == recorded["candidate"]["mean"]
        assert (shown_decision["eval_rollouts"], shown_decision["eval_failed"]) == (4, 0)
        assert shown_decision["sessions"] == 3
    assert decisions[2]["verdict"] == "kept out" and "below the noise bound" in decisions[2]["reason"]
    assert decisions[3]["verdict"] == "promoted" and decisions[3]["candidate_mean"] == 1.0
    assert (view["live_mean"], view["live_se"]) == (1.0, 0.0)


def test_the_html_page_and_its_links(serve_dashboard: DashboardThread, serve_facts: ServeFacts) -> None:
    run_id = serve_facts.run_id
    redirect = _get(serve_dashboard, "/serve")
    assert redirect.status_code == 307 and redirect.headers["location"] == f"/runs/{run_id}/serving"
    html = _get(serve_dashboard, f"/runs/{run_id}/serving").text
    assert 'id="sessions-table"' in html and 'data-session="judged"' in html and 'data-session="open"' in html
    assert "kept out" in html and "below the noise bound" in html and "promoted" in html
    assert f'href="/rollouts?run={run_id}&amp;step=2&amp;mode=val">4 rollouts' in html
    assert "awaiting feedback" in html and "scored by the judge" in html
    assert f'href="/runs/{run_id}/serving"' in _get(serve_dashboard, "/runs").text
    assert 'id="serving-link"' in _get(serve_dashboard, f"/runs/{run_id}").text
    few = _get(serve_dashboard, f"/api/runs/{run_id}/serving", params={"sessions": 2}).json()
    assert len(few["sessions"]) == 2 and few["sessions_total"] == RATED + 3
    assert {s["session_id"] for s in few["sessions"]} == {"open", "odd"}  # the newest


def test_bad_requests_say_what_to_do(serve_dashboard: DashboardThread, serve_facts: ServeFacts) -> None:
    bad = _get(serve_dashboard, f"/runs/{serve_facts.run_id}/serving", params={"sessions": "many"})
    assert bad.status_code == 400 and "sessions must be an integer" in bad.text
    too_many = _get(serve_dashboard, f"/api/runs/{serve_facts.run_id}/serving", params={"sessions": 10_000})
    assert too_many.status_code == 400 and "between 1 and 500" in too_many.text
    assert _get(serve_dashboard, "/runs/no-such-run/serving").status_code == 404


# The next two run their coroutines on a thread of their own (not as async tests): this module's
# browser fixture keeps Playwright's event loop on the main thread while the module runs.


def test_empty_states_tell_what_to_do(tmp_path: Path) -> None:
    async def check() -> None:
        store = open_store(f"sqlite:///{tmp_path / 'store.db'}")
        try:
            app = create_app(store)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://dash") as client:
                empty = await client.get("/serve")
                assert empty.status_code == 200 and "No <code>agentbolt serve</code> run in this store" in empty.text
                assert "agentbolt serve --upstream" in empty.text
                training = await store.start_run(RunSpec(name="a training run", algorithm="torch-grpo"))
                wrong = await client.get(f"/runs/{training.run_id}/serving")
                assert wrong.status_code == 200 and "is a training run" in wrong.text  # a page that says so, not a 400
                assert f'href="/runs/{training.run_id}"' in wrong.text
                assert "serving" not in (await client.get("/runs")).text.split("<main>")[1]
        finally:
            await store.close()

    _off_loop(check())


def test_a_record_only_server_says_it_trains_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'serve.db'}"

    async def serve_and_read() -> tuple[str, httpx.Response, dict[str, Any]]:
        async with (
            FakeLLMServer(FakeLLM(default_reply="Paris.")) as upstream,
            OnlineServer(url, upstream.base_url, state_dir=tmp_path / "state", token=TOKEN) as server,
        ):
            run_id = server.run_id
        store = open_store(url)
        try:
            app = create_app(store)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://dash") as client:
                return (
                    run_id,
                    await client.get(f"/runs/{run_id}/serving"),
                    (await client.get(f"/api/runs/{run_id}/serving")).json(),
                )
        finally:
            await store.close()

    run_id, page, view = _off_loop(serve_and_read())
    assert page.status_code == 200
    assert "This server records only" in page.text and "No judge" in page.text and "No sessions yet" in page.text
    assert view["run"]["run_id"] == run_id and view["trains"] is False and view["judge"]["configured"] is False
    assert [(v["version"], v["status"]) for v in view["versions"]] == [(1, "live")] and view["decisions"] == []


@pytest.mark.parametrize("width", [1360, 390])
def test_chromium_shows_the_sessions_and_the_gate(
    serve_dashboard: DashboardThread, serve_facts: ServeFacts, browser: Any, width: int
) -> None:
    context = browser.new_context(viewport={"width": width, "height": 900})
    page = context.new_page()
    page.set_default_timeout(15_000)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        page.goto(f"{serve_dashboard.url}/serve")
        assert page.url.endswith(f"/runs/{serve_facts.run_id}/serving")
        rows = page.locator("#sessions-table tbody tr")
        assert rows.count() == RATED + 3
        judged = page.locator('#sessions-table tr[data-session="judged"]')
        assert "judged" in judged.locator('[data-field="feedback"]').inner_text()
        kept_out = page.locator('#decisions-table tr[data-version="2"]')
        assert kept_out.locator('[data-field="status"]').inner_text() == "kept out"
        assert "below the noise bound" in kept_out.locator("td.reason").inner_text()
        live = page.locator('#decisions-table tr[data-version="3"]')
        assert live.locator('[data-field="status"]').inner_text() == "live"
        page.wait_for_selector("#serve-chart .uplot")
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, f"the page scrolls sideways by {overflow}px at {width}px"
        if width > 1000:  # one live refresh (every 5 s) replaces the sessions, tiles and decisions
            page.wait_for_selector("body[data-refreshed]")
        assert page.locator("#sessions-table tbody tr").count() == RATED + 3
        assert page.locator("#live-version").inner_text() == "3"
    finally:
        context.close()
    assert not errors, f"JavaScript errors: {errors}"
