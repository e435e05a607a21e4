"""Schemathesis over both servers' OpenAPI documents: no 5xx, no traceback in any body.

A fixed seed and a small example budget keep it fast and repeatable in CI;
``benchmarks/reliability.py`` (row R3) runs the same with a larger budget.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from schemathesis.checks import not_a_server_error

from agentbolt.gateway import GatewayThread
from agentbolt.store import open_store
from agentbolt.store.server import ServerThread

SEED = 20261125
EXAMPLES = 12


def no_traceback(ctx: Any, response: Any, case: Any) -> bool | None:
    """No Python traceback or exception repr leaks into a response body."""
    text = response.text or ""
    assert "Traceback (most recent call last)" not in text, f"traceback in the response to {case.method} {case.path}"
    return None


@pytest.fixture(scope="module")
def store_server() -> Iterator[ServerThread]:
    # waits are capped short: a fuzzed dequeue/wait must not idle for the default 30 s
    with ServerThread(open_store("memory://"), close_store=True, max_wait_s=0.2) as server:
        yield server


@pytest.fixture(scope="module")
def gateway() -> Iterator[GatewayThread]:
    with GatewayThread("memory://", [], pause_timeout_s=0.5) as gw:
        yield gw


@pytest.fixture(scope="module")
def store_schema(store_server: ServerThread) -> Any:
    return schemathesis.openapi.from_url(f"{store_server.url}/openapi.json")


@pytest.fixture(scope="module")
def gateway_schema(gateway: GatewayThread) -> Any:
    schema = schemathesis.openapi.from_url(f"{gateway.url}/openapi.json")
    # waiting routes would only test patience; drain is bounded by its validated timeout
    return schema.exclude(path_regex="^/gateway/(drain|flush)$")


_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
    database=None,
    phases=[Phase.explicit, Phase.generate],  # report the first failure as found, no shrinking
    report_multiple_bugs=False,
)


def fuzz(schema: Any, check: Callable[[Any], None]) -> int:
    """Run ``check(case)`` on generated cases of every operation; returns the operations run."""
    operations = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        operations += 1

        @given(case=operation.as_strategy())
        @hypothesis_seed(SEED)
        @_SETTINGS
        def run(case: Any) -> None:
            check(case)

        run()
    return operations


def test_store_server_never_answers_5xx(store_schema: Any) -> None:
    def check(case: Any) -> None:
        case.call_and_validate(checks=[not_a_server_error, no_traceback])

    assert fuzz(store_schema, check) >= 15


def test_gateway_never_answers_5xx(gateway_schema: Any) -> None:
    def check(case: Any) -> None:
        response = case.call_and_validate(checks=[no_traceback])
        # the gateway's own 5xx are upstream conditions (no upstream configured: 503), never a crash
        if response.status_code >= 500:
            error = response.json()["error"]["type"]
            assert error in ("agentbolt_upstream_error", "agentbolt_paused"), response.text

    assert fuzz(gateway_schema, check) >= 8
