"""The store's background sweeper: keeps going through failures without flooding the log."""

from __future__ import annotations

import logging
import threading

import pytest

from agentbolt.store.sweeper import Sweeper


def test_a_failing_sweep_logs_once_per_outage_and_recovery(caplog: pytest.LogCaptureFixture) -> None:
    calls = 0
    done = threading.Event()

    def sweep() -> int:
        nonlocal calls
        calls += 1
        if calls == 8:
            done.set()
        if calls <= 4:  # an outage of four intervals, then healthy again
            raise ConnectionError("database down")
        return 1

    caplog.set_level(logging.DEBUG, logger="agentbolt.store.sweeper")
    sweeper = Sweeper(sweep, 0.01, name="test-sweeper")
    try:
        assert done.wait(10), "the sweeper stopped calling sweep() after a failure"
    finally:
        sweeper.stop()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "database down" in warnings[0].getMessage()
    assert warnings[0].exc_info is not None
    assert sum("recovered" in r.getMessage() for r in caplog.records) == 1
    assert any("ended 1 attempts" in r.getMessage() for r in caplog.records)


def test_stop_ends_the_thread_and_a_disabled_sweeper_never_starts() -> None:
    sweeper = Sweeper(lambda: 0, 0.01, name="test-sweeper")
    sweeper.stop()
    assert sweeper._thread is not None and not sweeper._thread.is_alive()
    disabled = Sweeper(lambda: 0, 0, name="test-sweeper")
    disabled.start()
    assert disabled._thread is None
