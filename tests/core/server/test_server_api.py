"""The store server's HTTP surface: auth, error mapping, malformed input, OpenAPI, waits."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable

import httpx
import pytest
from server_doubles import FaultyStore, FaultyTransport, specs

from agentbolt import types as t
from agentbolt.errors import (
    ConflictError,
    InvalidTransitionError,
    NotFoundError,
    SchemaError,
    StaleAttemptError,
    StoreUnavailableError,
    UserError,
)
from agentbolt.store import Store, open_store
from agentbolt.store.http import HttpStore
from agentbolt.store.server import ServerThread
from agentbolt.store.server.run import is_loopback

Serve = Callable[..., ServerThread]


def assert_clean_error(response: httpx.Response, status: int, type_: str | None = None) -> dict:
    """A JSON error body with a type and a message, and never a traceback."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    assert "Traceback" not in response.text and 'File "' not in response.text
    error = response.json()["error"]
    assert error["message"]
    if type_ is not None:
        assert error["type"] == type_, error
    return error


# -- auth -----------------------------------------------------------------------------------------


def test_token_required_everywhere_but_health_and_docs(serve: Serve, http: httpx.Client) -> None:
    url = serve(token="s3cret").url
    for method, path in [
        ("POST", "/v1/rollouts/get"),
        ("GET", "/v1/rollouts"),
        ("POST", "/v1/spans"),
        ("POST", "/v1/traces"),
    ]:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret"}):
            response = http.request(method, url + path, json={"rollout_ids": []}, headers=headers)
            assert_clean_error(response, 401, "Unauthorized")
            assert response.headers["www-authenticate"] == "Bearer"
    ok = http.post(url + "/v1/rollouts/get", json={"rollout_ids": []}, headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 200 and ok.json() == {"rollouts": []}
    assert http.get(url + "/v1/health").json()["status"] == "ok"
    assert http.get(url + "/openapi.json").status_code == 200
    assert http.get(url + "/docs").status_code == 200


async def test_client_token_from_option_or_environment(serve: Serve, monkeypatch: pytest.MonkeyPatch) -> None:
    url = serve(token="s3cret").url
    monkeypatch.delenv("AGENTBOLT_STORE_TOKEN", raising=False)
    anonymous = open_store(url, retries=0)
    with pytest.raises(UserError, match="AGENTBOLT_STORE_TOKEN"):
        await anonymous.enqueue(specs(1))
    await anonymous.close()
    explicit = open_store(url, token="s3cret")
    assert [r.rollout_id for r in await explicit.enqueue(specs(1))] == ["r0"]
    await explicit.close()
    monkeypatch.setenv("AGENTBOLT_STORE_TOKEN", "s3cret")
    from_env = open_store(url)
    assert (await from_env.count_rollouts())[t.RolloutStatus.QUEUED] == 1
    await from_env.close()


def test_without_a_token_only_local_host_names_are_served(serve: Serve, http: httpx.Client) -> None:
    url = serve().url
    port = url.rsplit(":", 1)[1]
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "localhost"):
        assert http.get(url + "/v1/health", headers={"Host": host}).status_code == 200
    for host in (f"attacker.example:{port}", "10.0.0.5", ""):  # e.g. DNS rebinding from a web page
        assert_clean_error(http.get(url + "/v1/health", headers={"Host": host}), 421, "MisdirectedRequest")
    tokened = serve(token="s3cret").url
    response = http.get(tokened + "/v1/health", headers={"Host": "store.example.org"})
    assert response.status_code == 200


def test_public_bind_needs_a_token() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3")
    with pytest.raises(UserError, match="without a token"):
        ServerThread(open_store("memory://"), host="0.0.0.0")


# -- error mapping --------------------------------------------------------------------------------


async def _not_found(s: Store) -> None:
    await s.get_rollouts(["r0", "zzz"])


async def _unknown_version(s: Store) -> None:
    await s.get_resources(7)


async def _conflict(s: Store) -> None:
    await s.enqueue([t.RolloutSpec(rollout_id="r0", input="other")])


async def _stale(s: Store) -> None:
    (claim,) = await s.dequeue("w")
    await s.finish_attempt(claim.attempt.attempt_id, t.AttemptStatus.SUCCEEDED, reward=1.0)
    await s.finish_attempt(claim.attempt.attempt_id, t.AttemptStatus.FAILED)


async def _invalid_transition(s: Store) -> None:
    await s.purge(rollout_ids=["r1"])


async def _misuse(s: Store) -> None:
    await s.dequeue("w", limit=0)


async def _bad_cursor(s: Store) -> None:
    await s.query_rollouts(cursor="not-a-cursor")


async def _bad_report(s: Store) -> None:
    (claim,) = await s.dequeue("w")
    await s.finish_attempt(claim.attempt.attempt_id, t.AttemptStatus.TIMED_OUT)


@pytest.mark.parametrize(
    ("scenario", "expected"),
    [
        (_not_found, NotFoundError),
        (_unknown_version, NotFoundError),
        (_conflict, ConflictError),
        (_stale, StaleAttemptError),
        (_invalid_transition, InvalidTransitionError),
        (_misuse, UserError),
        (_bad_cursor, UserError),
        (_bad_report, UserError),
    ],
)
async def test_store_errors_arrive_as_the_same_class_and_message(
    serve: Serve, scenario: Callable[[Store], Awaitable[None]], expected: type[Exception]
) -> None:
    local = open_store("memory://", sweep_interval_s=0)
    remote = open_store(serve(open_store("memory://", sweep_interval_s=0)).url)
    errors = []
    for store in (local, remote):
        await store.enqueue(specs(2))
        with pytest.raises(expected) as caught:
            await scenario(store)
        errors.append(caught.value)
        await store.close()
    assert type(errors[1]) is type(errors[0])
    ids = re.compile(r"at-[0-9a-f]{16}")
    assert ids.sub("at-?", str(errors[1])) == ids.sub("at-?", str(errors[0]))
    if isinstance(errors[0], NotFoundError):
        assert (errors[1].what, errors[1].ids) == (errors[0].what, errors[0].ids)


@pytest.mark.parametrize(
    ("request_", "status", "type_"),
    [
        (("POST", "/v1/rollouts/get", {"rollout_ids": ["zzz"]}), 404, "NotFoundError"),
        (("GET", "/v1/resources?version=3", None), 404, "NotFoundError"),
        (("POST", "/v1/rollouts", {"specs": [{"rollout_id": "r0", "input": "x"}]}), 409, "ConflictError"),
        (("POST", "/v1/rollouts/purge", {"rollout_ids": ["r0"]}), 409, "InvalidTransitionError"),
        (("POST", "/v1/rollouts/dequeue", {"worker_id": "w", "limit": 0}), 422, "ValidationError"),
        (("POST", "/v1/rollouts/purge", {}), 400, "UserError"),
        (
            (
                "POST",
                "/v1/spans",
                {"spans": [{"trace_id": "a" * 32, "span_id": "b" * 16, "name": "x", "start_time_ns": 1}]},
            ),
            422,
            "SchemaError",
        ),
    ],
)
def test_status_codes(serve: Serve, request_: tuple, status: int, type_: str, http: httpx.Client) -> None:
    url = serve().url
    assert http.post(url + "/v1/rollouts", json={"specs": [{"rollout_id": "r0"}]}).status_code == 200
    method, path, body = request_
    error = assert_clean_error(http.request(method, url + path, json=body), status, type_)
    if type_ == "NotFoundError":
        assert error["what"] and error["ids"]


def test_stale_attempt_and_invalid_transition_have_distinct_types(serve: Serve, http: httpx.Client) -> None:
    url = serve().url
    http.post(url + "/v1/rollouts", json={"specs": [{"rollout_id": "r0"}]})
    (claim,) = http.post(url + "/v1/rollouts/dequeue", json={"worker_id": "w"}).json()["claims"]
    finish = {"attempt_id": claim["attempt"]["attempt_id"], "status": "succeeded"}
    assert http.post(url + "/v1/attempts/finish", json=finish).status_code == 200
    assert_clean_error(http.post(url + "/v1/attempts/finish", json=finish), 409, "StaleAttemptError")
    cancel = http.post(url + "/v1/rollouts/cancel", json={"rollout_ids": ["r0"]})
    assert_clean_error(cancel, 409, "InvalidTransitionError")


async def test_unavailable_store_is_503_and_retried_only_when_safe(serve: Serve, http: httpx.Client) -> None:
    def down() -> StoreUnavailableError:
        return StoreUnavailableError("database is locked")

    backend = FaultyStore(get_rollouts=[down(), down()], add_resources=[down()])
    url = serve(backend).url
    response = http.post(url + "/v1/rollouts/get", json={"rollout_ids": []})
    assert_clean_error(response, 503, "StoreUnavailableError")
    store = open_store(url, backoff_s=0.01)
    assert await store.get_rollouts([]) == []  # the second 503 was retried
    assert backend.calls["get_rollouts"] == 3
    with pytest.raises(StoreUnavailableError, match="database is locked"):
        await store.add_resources(t.Resources())  # a retry could store a second version
    assert backend.calls["add_resources"] == 1
    await store.close()


def test_unexpected_errors_are_500_without_details(
    serve: Serve, caplog: pytest.LogCaptureFixture, http: httpx.Client
) -> None:
    class PluginBug(RuntimeError):
        pass

    url = serve(FaultyStore(count_rollouts=[PluginBug("secret internal detail")])).url
    response = http.get(url + "/v1/rollouts/counts")
    error = assert_clean_error(response, 500, "InternalServerError")
    assert "secret" not in response.text and "log" in error["message"]
    logged = [r for r in caplog.records if r.exc_info and r.exc_info[0] is PluginBug]
    assert logged and "GET /v1/rollouts/counts" in logged[0].getMessage()


def test_a_plugin_error_subclass_travels_as_its_agentbolt_base(serve: Serve, http: httpx.Client) -> None:
    class RedisDown(StoreUnavailableError):
        pass

    url = serve(FaultyStore(sweep=[RedisDown("redis is down")])).url
    error = assert_clean_error(http.post(url + "/v1/sweep"), 503, "StoreUnavailableError")
    assert error["message"] == "redis is down"


# -- malformed requests ---------------------------------------------------------------------------

_JSON = {"content-type": "application/json"}

MALFORMED = [
    ("POST", "/v1/rollouts", b"{not json", _JSON, 422),
    ("POST", "/v1/rollouts", b'{"specs": "r0"}', _JSON, 422),
    ("POST", "/v1/rollouts", b'{"specs": [], "priority": 1}', _JSON, 422),
    ("POST", "/v1/rollouts", b'{"specs": [{"rollout_id": "a", "mode": "bogus"}]}', _JSON, 422),
    ("POST", "/v1/rollouts", b'{"specs": [{"max_attempts": "many"}]}', _JSON, 422),
    ("POST", "/v1/rollouts", b"[]", _JSON, 422),
    ("POST", "/v1/rollouts", b"", _JSON, 422),
    ("POST", "/v1/rollouts", b'{"specs": []}', {"content-type": "text/plain"}, 415),
    ("POST", "/v1/spans", b'{"spans": []}', {"content-type": "application/x-www-form-urlencoded"}, 415),
    ("POST", "/v1/spans", b'{"spans": []}', {}, 415),
    ("POST", "/v1/rollouts/dequeue", b'{"worker_id": "w", "mode": "bogus"}', _JSON, 422),
    ("POST", "/v1/rollouts/dequeue", b'{"worker_id": ["w"]}', _JSON, 422),
    ("POST", "/v1/attempts/finish", b'{"attempt_id": "a", "status": "bogus"}', _JSON, 422),
    ("POST", "/v1/attempts/heartbeat", b'{"attempt_ids": "a"}', _JSON, 422),
    ("GET", "/v1/rollouts?status=bogus", b"", {}, 422),
    ("GET", "/v1/rollouts?limit=ten", b"", {}, 422),
    ("GET", "/v1/resources?version=latest", b"", {}, 422),
    ("POST", "/v1/spans", b"{", _JSON, 422),
    ("POST", "/v1/spans", b'{"spans": {}}', _JSON, 422),
    (
        "POST",
        "/v1/spans",
        b'{"spans": [{"trace_id": "xyz", "span_id": "1", "name": "a", "start_time_ns": 0}]}',
        _JSON,
        422,
    ),
    ("POST", "/v1/spans", b'{"spans": [], "extra": true}', _JSON, 422),
    ("POST", "/v1/spans/query", b'{"rollout_ids": ["r0"], "after_seq": "x"}', _JSON, 422),
    ("GET", "/v1/no-such-endpoint", b"", {}, 404),
    ("DELETE", "/v1/rollouts", b"", {}, 405),
]


@pytest.mark.parametrize(("method", "path", "body", "headers", "status"), MALFORMED)
def test_malformed_requests_get_4xx_json_without_tracebacks(
    serve: Serve, method: str, path: str, body: bytes, headers: dict[str, str], status: int, http: httpx.Client
) -> None:
    url = serve().url
    error = assert_clean_error(http.request(method, url + path, content=body, headers=headers), status)
    if status == 422:
        assert error["type"] == "ValidationError" and error["message"].startswith("invalid request")


def test_validation_messages_say_what_is_wrong(serve: Serve, http: httpx.Client) -> None:
    url = serve().url
    error = assert_clean_error(
        http.post(url + "/v1/rollouts", content=b'{"specs": [], "priority": 1}', headers=_JSON), 422
    )
    assert "priority" in error["message"] and "Extra inputs" in error["message"]
    error = assert_clean_error(http.post(url + "/v1/rollouts", content=b"{not json", headers=_JSON), 422)
    assert "invalid JSON" in error["message"]


def test_oversized_bodies_are_refused(serve: Serve, http: httpx.Client) -> None:
    url = serve(max_request_bytes=1000).url
    big = json.dumps({"rollout_ids": ["x" * 2000]}).encode()
    for path in ("/v1/rollouts/get", "/v1/spans"):
        assert_clean_error(http.post(url + path, content=big, headers=_JSON), 413, "RequestTooLarge")
        chunked = http.post(url + path, content=iter([big[:600], big[600:]]), headers=_JSON)  # no Content-Length
        assert_clean_error(chunked, 413, "RequestTooLarge")


# -- OpenAPI --------------------------------------------------------------------------------------


def test_openapi_schema_describes_every_endpoint(serve: Serve, http: httpx.Client) -> None:
    schema = http.get(serve(token="s3cret").url + "/openapi.json").json()
    operations = {(method.upper(), path) for path, ops in schema["paths"].items() for method in ops}
    assert {
        ("POST", "/v1/rollouts"),
        ("POST", "/v1/rollouts/get"),
        ("GET", "/v1/rollouts"),
        ("GET", "/v1/rollouts/counts"),
        ("POST", "/v1/rollouts/dequeue"),
        ("POST", "/v1/rollouts/wait"),
        ("POST", "/v1/rollouts/cancel"),
        ("POST", "/v1/rollouts/purge"),
        ("GET", "/v1/rollouts/{rollout_id}/attempts"),
        ("POST", "/v1/attempts/heartbeat"),
        ("POST", "/v1/attempts/finish"),
        ("POST", "/v1/spans"),
        ("POST", "/v1/spans/query"),
        ("POST", "/v1/traces"),
        ("POST", "/v1/resources"),
        ("GET", "/v1/resources"),
        ("POST", "/v1/sweep"),
        ("GET", "/v1/health"),
    } <= operations
    components = schema["components"]["schemas"]
    refs = set(re.findall(r'"#/components/schemas/([^"]+)"', json.dumps(schema)))
    assert refs <= set(components), refs - set(components)
    spans_body = schema["paths"]["/v1/spans"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert spans_body == {"$ref": "#/components/schemas/AddSpansRequest"}
    assert "ErrorResponse" in components and "Span" in components
    assert schema["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert schema["paths"]["/v1/health"]["get"]["security"] == []


# -- bounded waits --------------------------------------------------------------------------------


def test_a_single_request_waits_at_most_the_server_cap(serve: Serve, http: httpx.Client) -> None:
    url = serve(max_wait_s=0.2).url
    http.post(url + "/v1/rollouts", json={"specs": [{"rollout_id": "r0"}]})
    # The timeouts bound the test only: uncapped, these requests would wait 1000 s.
    claims = http.post(url + "/v1/rollouts/dequeue", json={"worker_id": "w", "wait_s": 1000, "limit": 5}, timeout=20)
    assert [c["rollout"]["rollout_id"] for c in claims.json()["claims"]] == ["r0"]
    empty = http.post(url + "/v1/rollouts/dequeue", json={"worker_id": "w", "wait_s": 1000}, timeout=20)
    assert empty.json() == {"claims": []}
    waited = http.post(url + "/v1/rollouts/wait", json={"rollout_ids": ["r0"], "timeout": 1000}, timeout=20).json()
    assert waited["done"] is False and waited["rollouts"][0]["status"] == "running"
    unbounded = http.post(url + "/v1/rollouts/wait", json={"rollout_ids": ["r0"]}, timeout=20).json()
    assert unbounded["done"] is False


async def test_the_client_waits_longer_than_one_request(serve: Serve) -> None:
    backend = open_store("memory://")
    server = serve(backend, max_wait_s=0.2)
    transport = FaultyTransport()  # only counts requests here
    store = HttpStore(server.url, transport=transport)

    async def enqueue_later() -> None:
        await asyncio.sleep(0.7)
        await backend.enqueue(specs(1))

    task = asyncio.create_task(enqueue_later())
    (claim,) = await asyncio.wait_for(store.dequeue("w", wait_s=30), timeout=20)
    await task
    assert claim.rollout.rollout_id == "r0"
    assert transport.paths.count("/v1/rollouts/dequeue") >= 3  # several capped requests, no busy loop

    async def finish_later() -> None:
        await asyncio.sleep(0.7)
        await backend.finish_attempt(claim.attempt.attempt_id, t.AttemptStatus.SUCCEEDED, reward=1.0)

    task = asyncio.create_task(finish_later())
    (done,) = await asyncio.wait_for(store.wait_for_rollouts(["r0"]), timeout=20)  # no timeout: until final
    await task
    assert done.status is t.RolloutStatus.SUCCEEDED
    assert 3 <= transport.paths.count("/v1/rollouts/wait") <= 20
    await store.close()


def test_an_abandoned_wait_claims_nothing(serve: Serve, http: httpx.Client) -> None:
    backend = open_store("memory://")
    url = serve(backend).url
    with pytest.raises(httpx.ReadTimeout):  # the worker gives up (and closes its connection)
        httpx.post(url + "/v1/rollouts/dequeue", json={"worker_id": "gone", "wait_s": 20}, timeout=0.5)
    time.sleep(0.3)
    asyncio.run(backend.enqueue(specs(1)))
    time.sleep(0.3)
    assert asyncio.run(backend.get_attempts("r0")) == []  # the server did not claim it for nobody
    claims = http.post(url + "/v1/rollouts/dequeue", json={"worker_id": "w2"}).json()["claims"]
    assert [c["rollout"]["rollout_id"] for c in claims] == ["r0"]


async def test_shutdown_ends_waiting_requests(serve: Serve) -> None:
    server = serve()
    store = HttpStore(server.url, retries=1, backoff_s=0.01)
    waiting = asyncio.create_task(store.dequeue("w", wait_s=60))
    await asyncio.sleep(0.3)
    started = time.monotonic()
    await asyncio.to_thread(server.stop)
    assert time.monotonic() - started < 8  # the 60 s wait did not hold the shutdown
    with pytest.raises(StoreUnavailableError, match="cannot reach"):
        await waiting
    await store.close()


async def test_spans_and_attempts_of_awkward_rollout_ids(serve: Serve) -> None:
    store = open_store(serve().url)
    rid = "task 7/sample?2#x%y"
    await store.enqueue([t.RolloutSpec(rollout_id=rid)])
    (claim,) = await store.dequeue("w")
    assert await store.get_attempts(rid) == [claim.attempt]
    span = t.Span.create("a", rollout_id=rid, attempt_id=claim.attempt.attempt_id)
    assert await store.add_spans([span]) == 1
    assert (await store.query_spans([rid]))[rid][0].span_id == span.span_id
    with pytest.raises(SchemaError):  # checked before sending, as every backend does
        await store.add_spans([t.Span.create("no rollout")])
    await store.close()


def test_the_server_never_traces_itself(
    serve: Serve, http: httpx.Client, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Agents' environments point OpenTelemetry at the store server; FastAPI would then export the
    # server's own request spans there (to itself, when it is the same server).
    collector = serve().url
    monkeypatch.setenv("FASTAPI_OTEL_AUTO_CONFIGURE", "true")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector)
    server = serve()
    with caplog.at_level(logging.INFO, logger="agentbolt.store.server"):  # app and otlp_route
        for _ in range(3):
            http.get(server.url + "/v1/rollouts/counts")
        server.stop()  # would flush the spans FastAPI recorded to the collector
    assert "OTLP export" not in caplog.text
