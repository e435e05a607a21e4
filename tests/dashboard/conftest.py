"""One store filled by two real tiny-model training runs (torch-grpo through the Trainer), shared
by the dashboard's browser and CLI tests, and the dashboard serving it."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from dashboard_helpers import DashboardThread, train_tiny_runs

from agentbolt.testing.requirements import require

CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture(scope="session")
def tiny_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """``sqlite:///...`` holding two finished 2-step torch-grpo runs on the tiny random model."""
    pytest.importorskip("torch")
    pytest.importorskip("agentbolt_torch")
    root = tmp_path_factory.mktemp("dashboard-store")
    url = f"sqlite:///{root}/store.db"
    train_tiny_runs(url, root / "out", runs=2, steps=2)
    return url


@pytest.fixture(scope="session")
def store_db(tiny_store: str) -> Path:
    return Path(tiny_store.removeprefix("sqlite:///"))


@pytest.fixture(scope="session")
def dashboard(tiny_store: str) -> Iterator[DashboardThread]:
    with DashboardThread(tiny_store) as dash:
        yield dash


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's Chromium driven by Playwright (never a downloaded browser). Module-scoped:
    Playwright's sync API keeps an event loop running on the main thread while it is open,
    which later async tests of the session must not inherit."""
    require(CHROMIUM.exists(), str(CHROMIUM), "apt-get install chromium")
    require(importlib.util.find_spec("playwright") is not None, "playwright", "uv sync installs it: ./dev setup")
    from playwright import sync_api

    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=["--no-sandbox", "--disable-gpu"]
        )
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    page = context.new_page()
    page.set_default_timeout(15_000)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    yield page
    context.close()
    assert not errors, f"JavaScript errors: {errors}"
