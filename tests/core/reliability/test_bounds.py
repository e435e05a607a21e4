"""Bad input is a 4xx with a message at every edge, and a UserError in the Python API."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from agentbolt import types as t
from agentbolt.capture.emit import emit_reward
from agentbolt.errors import SchemaError, UserError
from agentbolt.gateway import Gateway
from agentbolt.store import RunSpec, Store, open_store
from agentbolt.store.server import ServerThread

HUGE = 10**30


@pytest_asyncio.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path}/s.db"
    opened = open_store(url)
    yield opened
    await opened.close()


async def test_python_api_refuses_bad_numbers(store: Store) -> None:
    await store.enqueue([t.RolloutSpec(rollout_id="r")])
    (claim,) = await store.dequeue("w")
    aid = claim.attempt.attempt_id
    for bad in (float("nan"), float("inf"), -1.0, 0.0, 10**400):
        with pytest.raises(UserError, match="lease_s"):
            await store.heartbeat([aid], lease_s=bad)
    for bad in (float("nan"), float("-inf"), 10**400):
        with pytest.raises(UserError, match="reward"):
            await store.finish_attempt(aid, t.AttemptStatus.SUCCEEDED, reward=bad)
    for limit in (0, HUGE, 2**63):
        with pytest.raises(UserError, match="limit"):
            await store.dequeue("w", limit=limit)
        with pytest.raises(UserError, match="limit"):
            await store.query_rollouts(limit=limit)
    for age in (-1.0, float("nan"), float("-inf")):
        with pytest.raises(UserError, match="older_than_s"):
            await store.purge(older_than_s=age)
    # the attempt is untouched by all of the above
    rollout = await store.finish_attempt(aid, t.AttemptStatus.SUCCEEDED, reward=1.0)
    assert rollout.status is t.RolloutStatus.SUCCEEDED and rollout.final_reward == 1.0


async def test_python_api_refuses_bad_numbers_for_runs(store: Store) -> None:
    run = await store.start_run(RunSpec(algorithm="evaluate"))
    for limit in (0, HUGE):
        with pytest.raises(UserError, match="limit"):
            await store.list_runs(limit=limit)
    with pytest.raises(UserError, match="step"):
        await store.add_run_metrics(run.run_id, HUGE, {"loss": 1.0})
    for value in (10**400, float("nan")):
        with pytest.raises(SchemaError, match="finite"):
            await store.add_run_metrics(run.run_id, 1, {"loss": value})
    with pytest.raises(UserError, match="after_seq"):
        await store.get_run_metrics(run.run_id, after_seq=HUGE)
    assert await store.get_run_metrics(run.run_id) == []  # nothing was recorded


def test_models_refuse_values_no_store_can_keep() -> None:
    with pytest.raises(ValueError, match="64 bits"):
        t.RolloutSpec(input={"n": HUGE})
    with pytest.raises(ValueError, match="finite"):
        t.RolloutSpec(metadata={"x": [1.0, float("nan")]})
    with pytest.raises(ValueError):
        t.Span.create("s", rollout_id="r", start_time_ns=2**64)
    with pytest.raises(ValueError, match="64 bits"):
        t.Span.create("s", rollout_id="r", attributes={"n": -(2**70)})
    with pytest.raises(ValueError, match="64 bits"):
        t.Span.create("s", rollout_id="r", attributes={"n": [1, 2**64]})


def test_emit_reward_refuses_nan_and_huge_numbers() -> None:
    with pytest.raises(UserError, match="finite"):
        emit_reward(float("nan"))
    with pytest.raises(UserError, match="at most 1e15 in magnitude"):
        emit_reward(10**400)
    with pytest.raises(UserError, match="finite"):
        emit_reward({"a": float("inf")})


@pytest.fixture
def server() -> Iterator[ServerThread]:
    with ServerThread(open_store("memory://"), close_store=True) as running:
        yield running


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/rollouts/dequeue", {"worker_id": "w", "limit": HUGE}),
        ("/v1/rollouts/dequeue", {"worker_id": "w", "lease_s": -1}),
        ("/v1/rollouts/dequeue", b'{"worker_id": "w", "wait_s": 1e400}'),
        ("/v1/attempts/heartbeat", {"attempt_ids": ["a"], "lease_s": 0}),
        ("/v1/rollouts/purge", {"older_than_s": -5}),
        ("/v1/rollouts/wait", {"rollout_ids": ["r"], "timeout": -1}),
        ("/v1/spans/query", {"rollout_ids": ["r"], "after_seq": HUGE}),
        ("/v1/rollouts", {"specs": [{"input": HUGE}]}),
        ("/v1/rollouts", {"specs": [{"resources_version": HUGE}]}),
        ("/v1/attempts/finish", b'{"attempt_id": "a", "status": "succeeded", "reward": 1e999}'),
        ("/v1/resources", {"extra": {"x": -HUGE}}),
        ("/v1/runs/run-x/metrics", {"step": HUGE, "values": {}}),
        ("/v1/runs/run-x/metrics", b'{"step": 1, "values": {"loss": 1e999}}'),
        ("/v1/rollouts/search", {"step": HUGE}),
        ("/v1/rollouts/search", {"offset": HUGE}),
        ("/v1/rollouts/search", b'{"reward_min": -1e999}'),
    ],
)
def test_store_server_answers_4xx_for_out_of_range_values(server: ServerThread, path: str, body: object) -> None:
    if isinstance(body, bytes):
        response = httpx.post(server.url + path, content=body, headers={"content-type": "application/json"})
    else:
        response = httpx.post(server.url + path, json=body)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["type"] == "ValidationError"


def test_store_server_refuses_nan_literals_and_huge_query_ints(server: ServerThread) -> None:
    nan = b'{"attempt_id": "a", "status": "succeeded", "reward": NaN}'
    answer = httpx.post(server.url + "/v1/attempts/finish", content=nan, headers={"content-type": "application/json"})
    assert answer.status_code == 422
    for query in (f"limit={HUGE}", "limit=0", "limit=-1"):
        assert httpx.get(f"{server.url}/v1/rollouts?{query}").status_code == 422
    assert httpx.get(f"{server.url}/v1/resources?version={HUGE}").status_code == 422
    for query in (f"limit={HUGE}", "limit=0"):
        assert httpx.get(f"{server.url}/v1/runs?{query}").status_code == 422
    assert httpx.get(f"{server.url}/v1/runs/run-x/metrics?after_seq={HUGE}").status_code == 422


@pytest_asyncio.fixture
async def gateway() -> AsyncIterator[Gateway]:
    store = open_store("memory://")
    gw = Gateway(store, [])
    await gw.start()
    yield gw
    await gw.stop()
    await store.close()


@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("policy", {"version": "seven"}),
        ("policy", {"version": HUGE}),
        ("policy", {"version": -1}),
        ("policy", {"sampling": [1, 2]}),
        ("policy", {"sampling": {"temperature": HUGE}}),
        ("upstreams", {"upstreams": "http://x"}),
        ("upstreams", {"upstreams": [{"base_url": "ftp://x"}]}),
        ("upstreams", {"upstreams": [{"nope": 1}]}),
        ("upstreams", {"upstreams": [42]}),
        ("drain", {"timeout": -1}),
        ("drain", {"timeout": "soon"}),
        ("pause", {"extra": True}),
        ("pause", [1]),
    ],
)
async def test_gateway_control_routes_answer_422_on_bad_bodies(gateway: Gateway, route: str, body: object) -> None:
    async with httpx.AsyncClient(base_url=gateway.url) as http:
        response = await http.post(f"/gateway/{route}", json=body)
    assert response.status_code == 422, response.text
    assert "invalid request" in response.json()["error"]["message"]
    assert gateway.stats()["upstreams"] == [] and not gateway.paused


async def test_gateway_control_routes_accept_good_bodies(gateway: Gateway) -> None:
    async with httpx.AsyncClient(base_url=gateway.url) as http:
        ok = await http.post("/gateway/policy", json={"version": 3, "sampling": {"temperature": 0.5}})
        assert ok.status_code == 200 and ok.json()["policy_version"] == 3
        ok = await http.post("/gateway/upstreams", json={"upstreams": [{"base_url": "http://127.0.0.1:9/v1"}]})
        assert ok.json()["upstreams"] == ["http://127.0.0.1:9/v1"]
        assert (await http.get("/openapi.json")).json()["info"]["title"] == "agentbolt gateway"
