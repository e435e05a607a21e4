"""The gateway: an OpenAI-compatible proxy that records every LLM call of every rollout.

Agents get a base URL scoped to their rollout and attempt::

    {gateway}/rollouts/{rollout_id}/attempts/{attempt_id}/v1

(or send ``X-Agentbolt-Rollout-Id`` / ``X-Agentbolt-Attempt-Id`` headers to ``{gateway}/v1``;
``X-Agentbolt-Agent-Name`` names the calling agent when no framework adapter does).
For each call the gateway

1. checks the attempt is known and still running (cached, so steady-state calls never wait on
   the store),
2. waits while paused (weight updates), bounded, then answers 503 with ``Retry-After``,
3. forces the served model name and the current sampling parameters when configured, and asks
   the upstream for exact token ids and logprobs (vLLM's ``return_token_ids`` / ``logprobs``),
4. forwards to an upstream chosen by rollout (sticky), streaming chunks through as they arrive,
5. writes one LLM-call span, whose ``gen_ai.response.id`` is the id the client received and
   whose span id is returned in the ``X-Agentbolt-Span-Id`` response header. An answered call's
   span is durable before the answer's last byte leaves (``durable_calls``: appended to a local
   call log, or else committed to the store, group-committed with the other calls waiting);
   spans reach the store in background batches (:meth:`Gateway.flush` waits for them).

Upstream failures become OpenAI-style errors with ``type = "agentbolt_upstream_error"`` (502,
or 504 on timeout) plus an error span; runners treat such failures as infrastructure errors,
which the store retries while attempts remain.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

import orjson
from pydantic import ValidationError

from .. import semconv
from ..capture.roles import AgentNamer
from ..errors import UserError
from ..hosts import is_loopback_name
from ..store.base import Store
from . import control, messages_api, responses_api, upstream_checks
from .attempts import AttemptCache
from .call_log import CallLog
from .http import HttpServer, Request, Responder
from .recorder import CallRecord, Retokenizer, parse_traceparent
from .relay import UPSTREAM_ERROR, error_body, relay_stream
from .routing import CallRouter, ExtraRoute, RoutedCall, RouteError
from .span_writer import SpanWriter
from .translate import Dialect, TranslationError
from .upstream import UpstreamError, UpstreamPool

__all__ = ["Gateway", "Upstream"]

log = logging.getLogger(__name__)

ROLLOUT_HEADER = "x-agentbolt-rollout-id"
ATTEMPT_HEADER = "x-agentbolt-attempt-id"
SPAN_HEADER = "x-agentbolt-span-id"
AGENT_HEADER = "x-agentbolt-agent-name"
"""Optional request header naming the agent that makes the call (recorded as gen_ai.agent.name)."""
POLICY_HEADER = "x-agentbolt-policy-version"
POLICY_NAME_HEADER = "x-agentbolt-policy"
"""Response header of an upstream serving several policies: the policy (adapter) that answered."""
LLM_API = semconv.LLM_API

_OPERATIONS = {"/v1/chat/completions": semconv.OP_CHAT, "/v1/completions": semconv.OP_TEXT_COMPLETION}


_DIALECTS: dict[str, Dialect] = {"/v1/responses": responses_api.DIALECT, "/v1/messages": messages_api.DIALECT}
"""Client APIs translated to Chat Completions upstream (see :mod:`.translate`)."""
_JSON = [("content-type", "application/json")]


@dataclass(frozen=True)
class Upstream:
    """An OpenAI-compatible inference endpoint the gateway forwards to."""

    base_url: str
    """Base URL including ``/v1``, e.g. ``http://127.0.0.1:8000/v1``."""
    api_key: str | None = None
    """Sent as ``Authorization: Bearer`` to the upstream (the client's key is never forwarded)."""
    model: str | None = None
    """Model name the upstream serves; forced into every request when set."""

    @classmethod
    def of(cls, value: Upstream | str) -> Upstream:
        return value if isinstance(value, Upstream) else cls(base_url=value)


class Gateway:
    """The OpenAI-compatible gateway. Runs on the event loop it is started from.

    Args:
        store: where spans go and attempts are checked.
        upstreams: OpenAI-compatible endpoints (URLs or :class:`Upstream`); may start empty and be
            set later with :meth:`set_upstreams` (calls meanwhile get 503).
        token: if set, clients must send ``Authorization: Bearer <token>`` (their OpenAI
            ``api_key``); required when binding beyond loopback.
        served_model: model name forced into requests (overrides ``Upstream.model``).
        sampling: sampling parameters forced into requests (e.g. ``{"temperature": 1.0}``).
        policy_version: recorded on spans unless the upstream reports ``X-Agentbolt-Policy-Version``.
        request_timeout_s: longest wait for an upstream answer (and between streamed chunks).
        pause_timeout_s: how long a call waits while the gateway is paused before a 503.
        attempt_ttl_s: how often an attempt known to be running is re-checked, in the background
            while its calls keep flowing (0: every call waits for a fresh check).
        flush_interval_s: span batching delay (of spans no answer waits for).
        readiness: returns ``None`` when the gateway can answer calls, else why not (``GET
            /ready`` answers 503 with it); default: ready once an upstream is set.
        durable_calls: an answered call's span is durable before the answer's last byte
            is sent (non-streaming: before the response; streaming: before ``data: [DONE]`` or
            the translated API's closing events), so a crash at any moment loses no call a
            client received in full. With ``call_log``, "durable" means appended to the local
            log (one ``write``; the store gets the span in the next background batch); without
            it, the answer waits for the store's commit (calls waiting at once share one
            transaction). ``False`` queues them like other spans (written within
            ``flush_interval_s``; a crash loses the last ones).
        call_log: directory of the local call log (:mod:`agentbolt.gateway.call_log`); on
            :meth:`start`, the calls a gateway that died left there are added to the store
            first. Several gateways may share one directory. Survives ``kill -9`` of the
            process, not a power cut (as the SQLite store's default ``synchronous=NORMAL``).
        retokenize: ``(request, response) -> (prompt_ids, response_ids)`` for upstreams that
            return no ids; spans then say ``token_source = "retokenized"``.
        request_token_ids: ask upstreams for ``return_token_ids`` and logprobs (vLLM style).
        allowed_hosts: ``Host`` names a tokenless gateway answers besides loopback ones (e.g.
            ``host.docker.internal`` for agents in containers); other names are refused (421),
            which keeps web pages (DNS rebinding) away from it.
        max_connections_per_client: open connections one client address may hold; a new one over
            it closes the client's longest-idle connection, or is refused (503) when none is idle.
        header_timeout_s, body_timeout_s: deadlines for receiving a request's headers and body
            (a client trickling bytes is cut off: slowloris).
        agent_names: names the agent of calls that send no ``X-Agentbolt-Agent-Name`` header, from
            the (Chat Completions) request: see :class:`agentbolt.capture.roles.AgentRoles`.
        policy_router: policies by role (:mod:`agentbolt.policies`): agent name -> the policy
            that serves its calls, or ``None`` for the base model. A routed call asks the
            upstream for the policy's name as its model (how vLLM serves a LoRA adapter, and the
            agentbolt-torch policy server an adapter); its span records the policy
            (``agentbolt.llm.policy``: the upstream's ``X-Agentbolt-Policy`` when it sends one).
        router: records calls that name no rollout (live clients of ``agentbolt serve``) under
            the rollout and attempt it picks (:mod:`agentbolt.gateway.routing`); without one such
            calls get 400.
        routes: further ``POST``/``GET`` paths answered on this port by their handler (after the
            token and Host checks), e.g. ``/v1/feedback``.
        openapi_paths: OpenAPI path items of ``routes``, added to ``GET /openapi.json``.
    """

    def __init__(
        self,
        store: Store,
        upstreams: Sequence[Upstream | str],
        *,
        token: str | None = None,
        served_model: str | None = None,
        sampling: Mapping[str, Any] | None = None,
        policy_version: int | None = None,
        request_timeout_s: float = 600.0,
        pause_timeout_s: float = 60.0,
        attempt_ttl_s: float = 2.0,
        flush_interval_s: float = 0.05,
        durable_calls: bool = True,
        call_log: str | os.PathLike[str] | None = None,
        span_batch: int = 64,
        max_buffered_spans: int = 200_000,
        retokenize: Retokenizer | None = None,
        request_token_ids: bool = True,
        allowed_hosts: Sequence[str] = (),
        max_connections_per_client: int = 256,
        header_timeout_s: float = 10.0,
        body_timeout_s: float = 60.0,
        agent_names: AgentNamer | None = None,
        policy_router: Callable[[str | None], str | None] | None = None,
        router: CallRouter | None = None,
        routes: Mapping[str, ExtraRoute] | None = None,
        openapi_paths: Mapping[str, Any] | None = None,
        readiness: Callable[[], str | None] | None = None,
    ) -> None:
        if not (isinstance(request_timeout_s, int | float) and 0 < request_timeout_s < float("inf")):
            raise UserError(f"request_timeout_s must be a positive number of seconds, got {request_timeout_s!r}")
        self.store = store
        self.token = token
        self.served_model = served_model
        self.sampling: dict[str, Any] = dict(sampling or {})
        self.policy_version = policy_version
        self.request_timeout_s = request_timeout_s
        self.pause_timeout_s = pause_timeout_s
        self.request_token_ids = request_token_ids
        self.durable_calls = durable_calls
        self.readiness = readiness
        self.allowed_hosts = [h.lower() for h in allowed_hosts]
        self._hosts_checked: dict[str | None, bool] = {}
        self.agent_names = agent_names
        self.policy_router = policy_router
        self.router = router
        self.routes: dict[str, ExtraRoute] = dict(routes or {})
        self.openapi_paths: dict[str, Any] = dict(openapi_paths or {})
        self._upstream_inflight: dict[str, int] = {}
        self._upstream_done = asyncio.Event()
        self._upstreams: list[Upstream] = []
        self._pools: dict[str, UpstreamPool] = {}
        self.set_upstreams(upstreams)
        self._server = HttpServer(
            self._handle,
            max_connections_per_client=max_connections_per_client,
            header_timeout_s=header_timeout_s,
            body_timeout_s=body_timeout_s,
        )
        self.host = "127.0.0.1"
        self.port = 0
        self._running = asyncio.Event()
        self._running.set()
        self._inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._attempts = AttemptCache(store, attempt_ttl_s)
        self.call_log = CallLog(call_log) if call_log is not None and durable_calls else None
        self._spans = SpanWriter(
            store,
            interval_s=flush_interval_s,
            batch=span_batch,
            max_buffered=max_buffered_spans,
            retokenize=retokenize,
            call_log=self.call_log,
        )
        self.counters = {"requests": 0, "errors": 0, "upstream_errors": 0, "rejected": 0, "streams": 0, "forwarded": 0}
        """``forwarded``: calls sent to an upstream (each gets one span: compare with ``spans_recorded``)."""

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Listen on ``host:port`` (port 0 picks a free one); returns the base URL."""
        if not is_loopback_name(host) and not self.token:
            raise UserError(
                f"refusing to bind the gateway to {host} without a token: anyone who can reach it could "
                "spend your inference backend. Pass token=... (agents then use it as their api_key)."
            )
        if self.call_log is not None:  # what a gateway that died left in the log goes to the store first
            await self.call_log.recover(self.store)
            self.call_log.open()
        self.host = host
        self.port = await self._server.start(host, port)
        self._spans.start()
        log.info("gateway listening on %s (upstreams: %s)", self.url, ", ".join(u.base_url for u in self._upstreams))
        return self.url

    async def stop(self) -> None:
        """Stop serving (in-flight calls get a few seconds), write pending spans, close pools."""
        self._running.set()
        await self._server.stop()
        await self._spans.stop()
        if self.call_log is not None:
            self.call_log.close()
        for pool in self._pools.values():
            pool.close()

    @property
    def url(self) -> str:
        """Base URL of the gateway, e.g. ``http://127.0.0.1:4801``."""
        host = self.host if ":" not in self.host else f"[{self.host}]"
        return f"http://{host}:{self.port}"

    def base_url_for(self, rollout_id: str, attempt_id: str) -> str:
        """The OpenAI base URL an agent uses for one attempt."""
        return f"{self.url}/rollouts/{quote(rollout_id, safe='')}/attempts/{quote(attempt_id, safe='')}/v1"

    # -- control --------------------------------------------------------------------------------

    def set_upstreams(self, upstreams: Sequence[Upstream | str]) -> None:
        """Replace the upstreams (e.g. new inference replicas); in-flight calls finish where they are."""
        new = [Upstream.of(u) for u in upstreams]
        for u in new:
            try:
                control.check_upstream_url(u.base_url)
            except ValueError as exc:
                raise UserError(str(exc)) from None
        for u in new:
            if u.base_url not in self._pools:
                self._pools[u.base_url] = UpstreamPool(u.base_url)
        for url in [url for url in self._pools if url not in {u.base_url for u in new}]:
            self._pools.pop(url).close()
        self._upstreams = new

    @property
    def upstreams(self) -> list[Upstream]:
        """The upstreams new calls go to."""
        return list(self._upstreams)

    def set_policy(
        self, *, version: int | None = None, sampling: Mapping[str, Any] | None = None, model: str | None = None
    ) -> None:
        """Record a new policy version and, optionally, new forced sampling parameters / model."""
        if version is not None:
            self.policy_version = version
        if sampling is not None:
            self.sampling = dict(sampling)
        if model is not None:
            self.served_model = model

    def pause(self) -> None:
        """New calls wait (up to ``pause_timeout_s``); calls already upstream continue."""
        self._running.clear()

    def resume(self) -> None:
        """Release waiting calls."""
        self._running.set()

    @property
    def paused(self) -> bool:
        return not self._running.is_set()

    def upstream_inflight(self, base_url: str) -> int:
        """Calls now in flight to the upstream ``base_url`` (a current or a former one)."""
        return self._upstream_inflight.get(base_url, 0)

    async def drain_upstream(self, base_url: str, timeout: float | None = None) -> bool:
        """Wait until no call is in flight to ``base_url`` (e.g. an upstream just replaced by
        :meth:`set_upstreams`, whose weights are about to change); False on timeout. Calls to
        other upstreams are not held: this is how ``agentbolt serve`` swaps a policy version
        without pausing live traffic."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while self._upstream_inflight.get(base_url, 0) > 0:
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return False
            self._upstream_done.clear()
            try:
                await asyncio.wait_for(self._upstream_done.wait(), remaining)
            except TimeoutError:
                return False
        return True

    async def drain(self, timeout: float | None = None) -> bool:
        """Wait until no call is in flight; returns False on timeout."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
            return True
        except TimeoutError:
            return False

    async def flush(self, timeout: float | None = 60.0) -> None:
        """Wait until every span recorded so far is in the store."""
        await self._spans.flush(timeout)

    def not_ready(self) -> str | None:
        """``None`` when calls can be answered (``GET /ready`` is 200), else why not (503): no
        upstream yet, or the ``readiness`` check's reason."""
        if self.readiness is not None:
            return self.readiness()
        return None if self._upstreams else "no inference backend is configured yet"

    def stats(self) -> dict[str, Any]:
        """Counters for monitoring."""
        return {
            **self.counters,
            "inflight": self._inflight,
            "connections": len(self._server.connections),
            "idle_connections_evicted": self._server.evicted,
            "paused": self.paused,
            "spans_buffered": len(self._spans.buffered),
            "spans_recorded": self._spans.added,
            "spans_written": self._spans.written,
            "spans_dropped": self._spans.dropped,
            "spans_late": self._spans.late,
            "calls_recovered": self.call_log.recovered if self.call_log is not None else 0,
            "policy_version": self.policy_version,
            "upstreams": [u.base_url for u in self._upstreams],
        }

    # -- request handling -----------------------------------------------------------------------

    async def _handle(self, request: Request, responder: Responder) -> None:
        path = request.path
        if self.token is None and not self._host_allowed(request.headers.get("host")):
            # Without a token only this machine may use the gateway: refusing other Host names
            # defeats DNS rebinding by web pages the user visits.
            return self._reply(
                responder,
                421,
                f"Host {request.headers.get('host', '')!r} refused: a gateway without a token only answers "
                "requests addressed to localhost or a loopback address; pass token=... (or allowed_hosts=...) "
                "to serve other names",
                "invalid_request_error",
            )
        if path == "/ready" and request.method == "GET":
            reason = self.not_ready()
            if reason is None:
                return responder.send(200, orjson.dumps({"status": "ready"}))
            return responder.send(503, orjson.dumps({"status": "starting", "reason": reason}), [("retry-after", "1")])
        if path == "/openapi.json" and request.method == "GET":
            return responder.send(200, orjson.dumps(self.openapi()))
        if path.startswith("/rollouts/"):
            parts = path.split("/", 5)
            if len(parts) < 6 or parts[3] != "attempts" or not parts[2] or not parts[4]:
                return self._reply(
                    responder, 404, "use /rollouts/{rollout_id}/attempts/{attempt_id}/v1/...", "invalid_request_error"
                )
            rollout_id, attempt_id, sub = unquote(parts[2]), unquote(parts[4]), "/" + parts[5]
        else:
            rollout_id = request.headers.get(ROLLOUT_HEADER, "")
            attempt_id = request.headers.get(ATTEMPT_HEADER, "")
            sub = path
        if sub.startswith("/gateway/"):
            return await self._control(request, responder, sub)
        if self.token is not None and not self._authorized(request):
            return self._reply(
                responder, 401, "missing or wrong bearer token for the agentbolt gateway", "authentication_error"
            )
        if sub == "/v1/models" and request.method == "GET":
            return self._models(responder)
        extra = self.routes.get(sub)
        if extra is not None:
            status, payload, headers = await extra(request)
            if status >= 500:
                self.counters["errors"] += 1
            return responder.send(status, payload, headers)
        dialect = _DIALECTS.get(sub)
        operation = semconv.OP_CHAT if dialect is not None else _OPERATIONS.get(sub)
        if operation is None:
            return self._reply(responder, 404, f"no route for {request.method} {path}", "invalid_request_error")
        if request.method != "POST":
            return self._reply(responder, 405, f"{sub} takes POST", "invalid_request_error")
        routed_here = not rollout_id or not attempt_id
        if routed_here and self.router is None:
            return self._reply(
                responder,
                400,
                "which rollout is this call for? Use base_url={gateway}/rollouts/{rollout_id}/attempts/{attempt_id}/v1 "
                f"(resources.llm.base_url already is) or send {ROLLOUT_HEADER} and {ATTEMPT_HEADER} headers",
                "invalid_request_error",
            )
        self.counters["requests"] += 1
        if not routed_here:
            problem = await self._attempts.check(rollout_id, attempt_id)
            if problem is not None:
                self.counters["rejected"] += 1
                return self._reply(responder, problem[0], problem[1], problem[2])
        if not self._running.is_set():
            try:
                await asyncio.wait_for(self._running.wait(), self.pause_timeout_s)
            except TimeoutError:
                self.counters["rejected"] += 1
                retry = str(max(1, int(self.pause_timeout_s)))
                return self._reply(
                    responder,
                    503,
                    "the policy is being updated; retry shortly",
                    "agentbolt_paused",
                    [("retry-after", retry)],
                )
        try:
            body = orjson.loads(request.body)
        except orjson.JSONDecodeError as exc:
            return self._reply(responder, 400, f"request body is not valid JSON: {exc}", "invalid_request_error")
        if not isinstance(body, dict):
            return self._reply(responder, 400, "request body must be a JSON object", "invalid_request_error")
        chat_body = body
        if dialect is not None:  # Responses / Messages API: forwarded as Chat Completions
            try:
                chat_body = dialect.to_chat(body)
            except (TranslationError, KeyError, TypeError, AttributeError) as exc:
                return self._reply(responder, 400, f"cannot translate this request: {exc}", "invalid_request_error")
        routed: RoutedCall | None = None
        if routed_here:
            assert self.router is not None
            if not self._upstreams:  # refused before a session is opened for it
                return self._no_upstream(responder)
            try:
                routed = await self.router.route(request.headers, body, sub)
            except RouteError as exc:
                self.counters["rejected"] += 1
                return self._reply(responder, exc.status, exc.message, exc.type)
            rollout_id, attempt_id = routed.rollout_id, routed.attempt_id
        self._inflight += 1
        self._idle.clear()
        record: CallRecord | None = None
        upstream = self._upstream_for(rollout_id)
        try:
            if upstream is None:
                self._no_upstream(responder)
            else:
                self._upstream_started(upstream.base_url)
                try:
                    record = await self._call_upstream(
                        request,
                        responder,
                        rollout_id,
                        attempt_id,
                        operation,
                        chat_body,
                        body,
                        dialect,
                        upstream,
                        routed.headers if routed else [],
                    )
                finally:
                    self._upstream_ended(upstream.base_url)
        finally:
            self._inflight -= 1
            if self._inflight == 0:
                self._idle.set()
            if routed is not None:
                assert self.router is not None
                try:
                    self.router.finished(routed, record)
                except Exception:  # the router's bookkeeping must not fail the call
                    log.exception("the gateway's call router failed on a finished call")

    def _name_agent(self, body: Mapping[str, Any]) -> str | None:
        if self.agent_names is None:
            return None
        try:
            return self.agent_names(body)
        except Exception:  # a user's rule must not break the proxy
            log.exception("agent_names raised on a request; the call is recorded without an agent name")
            return None

    def _route(self, agent_name: str | None) -> str | None:
        assert self.policy_router is not None
        try:
            return self.policy_router(agent_name)
        except Exception:  # a user's match predicate must not break the proxy
            log.exception("the policy router raised on agent %r; the call goes to the base model", agent_name)
            return None

    def _host_allowed(self, host: str | None) -> bool:
        """:func:`control.host_allowed`, remembered per ``Host`` value (parsing an IP address
        costs more than the rest of the check, and clients send the same few values)."""
        allowed = self._hosts_checked.get(host)
        if allowed is None:
            allowed = control.host_allowed(host, self.allowed_hosts)
            if len(self._hosts_checked) < 1024:  # bounded: a client may send any Host
                self._hosts_checked[host] = allowed
        return allowed

    def _authorized(self, request: Request) -> bool:
        assert self.token is not None
        if "x-api-key" in request.headers:  # Anthropic clients send their key this way
            return hmac.compare_digest(request.headers["x-api-key"].encode(), self.token.encode())
        return control.bearer_matches(request.headers.get("authorization"), self.token)

    def openapi(self) -> dict[str, Any]:
        """The gateway's OpenAPI document (also served at ``GET /openapi.json``)."""
        return control.openapi_document(secured=self.token is not None, extra_paths=self.openapi_paths)

    def _reply(
        self,
        responder: Responder,
        status: int,
        message: str,
        type_: str,
        headers: list[tuple[str, str]] | None = None,
        code: str | None = None,
    ) -> None:
        if status >= 500:
            self.counters["errors"] += 1
        responder.send(status, error_body(message, type_, code), headers)

    def _models(self, responder: Responder) -> None:
        names = [self.served_model] if self.served_model else [u.model for u in self._upstreams if u.model]
        data = [{"id": n, "object": "model", "created": 0, "owned_by": "agentbolt"} for n in dict.fromkeys(names)]
        responder.send(200, orjson.dumps({"object": "list", "data": data}))

    def _prepare(self, body: dict[str, Any], operation: str, upstream: Upstream) -> None:
        model = self.served_model or upstream.model
        if model:
            body["model"] = model
        body.update(self.sampling)
        if self.request_token_ids:
            body["return_token_ids"] = True
            if operation == semconv.OP_CHAT:
                body["logprobs"] = True
            elif not body.get("logprobs"):
                body["logprobs"] = 1

    def _no_upstream(self, responder: Responder) -> None:
        self.counters["upstream_errors"] += 1
        self._reply(responder, 503, "no inference backend is configured yet", UPSTREAM_ERROR, [("retry-after", "5")])

    def _upstream_for(self, rollout_id: str) -> Upstream | None:
        """The upstream that serves ``rollout_id`` (every call of a rollout goes to the same one);
        ``None`` when no upstream is configured."""
        if not self._upstreams:
            return None
        return self._upstreams[zlib.crc32(rollout_id.encode()) % len(self._upstreams)]

    def _upstream_started(self, url: str) -> None:
        """A call goes to upstream ``url``: counted in flight (:meth:`upstream_inflight`) until
        :meth:`_upstream_ended`."""
        self._upstream_inflight[url] = self._upstream_inflight.get(url, 0) + 1

    def _upstream_ended(self, url: str) -> None:
        left = self._upstream_inflight[url] - 1
        if left:
            self._upstream_inflight[url] = left
        else:
            del self._upstream_inflight[url]
        self._upstream_done.set()

    async def _call_upstream(
        self,
        request: Request,
        responder: Responder,
        rollout_id: str,
        attempt_id: str,
        operation: str,
        body: dict[str, Any],
        api_body: dict[str, Any],
        dialect: Dialect | None,
        upstream: Upstream,
        extra_headers: list[tuple[str, str]] | None,
    ) -> CallRecord:
        """Forward ``body`` (Chat Completions; ``api_body`` is what the client sent, translated
        by ``dialect`` for the Responses / Messages APIs) to ``upstream`` and record the call."""
        pool = self._pools[upstream.base_url]
        self._prepare(body, operation, upstream)
        span_id = os.urandom(8).hex()
        trace_id, parent = parse_traceparent(request.headers.get("traceparent"))
        record = CallRecord(
            rollout_id=rollout_id,
            attempt_id=attempt_id,
            operation=operation,
            request=body,
            upstream=upstream.base_url,
            start_ns=time.time_ns(),
            stream=bool(body.get("stream")),
            policy_version=self.policy_version,
            trace_id=trace_id,
            parent_span_id=parent,
        )
        agent_name = request.headers.get(AGENT_HEADER) or self._name_agent(body)
        if agent_name:
            record.extra[semconv.GEN_AI_AGENT_NAME] = agent_name
        if self.policy_router is not None and (policy := self._route(agent_name)) is not None:
            body["model"] = policy  # the upstream serves the policy's adapter by this name
            record.extra[semconv.POLICY_NAME] = policy
        if dialect is not None:
            record.extra[LLM_API] = dialect.name
        headers = [("content-type", "application/json"), ("accept", request.headers.get("accept", "application/json"))]
        if upstream.api_key:
            headers.append(("authorization", f"Bearer {upstream.api_key}"))
        sub = "/chat/completions" if operation == semconv.OP_CHAT else "/completions"
        started = time.perf_counter()
        self.counters["forwarded"] += 1
        try:
            answer = await pool.request("POST", sub, orjson.dumps(body), headers, timeout_s=self.request_timeout_s)
        except UpstreamError as exc:
            self._upstream_failed(responder, record, span_id, exc, extra_headers)
            return record
        record.upstream_latency_s = time.perf_counter() - started
        if answer.headers.get(POLICY_HEADER, "").isdigit():
            record.policy_version = int(answer.headers[POLICY_HEADER])
        if answer.headers.get(POLICY_NAME_HEADER):
            record.extra[semconv.POLICY_NAME] = answer.headers[POLICY_NAME_HEADER]
        out_headers = [(SPAN_HEADER, span_id), *(extra_headers or ())]
        if record.policy_version is not None:
            out_headers.append((POLICY_HEADER, str(record.policy_version)))
        if answer.status == 200 and answer.is_stream:
            translator = dialect.stream(api_body) if dialect is not None else None

            async def finish() -> None:  # the record is complete; the stream's last event not yet sent
                if dialect is not None and record.response and record.response.get("id"):
                    record.extra[semconv.GEN_AI_RESPONSE_ID] = dialect.response_id(str(record.response["id"]))
                await self._record_answered(record, span_id)

            await relay_stream(answer, responder, record, out_headers, self.counters, translator, finish)
            return record
        try:
            data = await answer.read()
        except UpstreamError as exc:
            self._upstream_failed(responder, record, span_id, exc, extra_headers)
            return record
        record.end_ns = time.time_ns()
        if answer.status >= 500:
            self._upstream_failed(responder, record, span_id, None, extra_headers, status=answer.status, body=data)
            return record
        record.status = answer.status
        if answer.status != 200:  # a client error: pass it through unchanged
            record.error_type = f"http_{answer.status}"
            record.error_message = data[:2000].decode("utf-8", "replace")
            responder.send(answer.status, data, out_headers)
            self._record(record, span_id)
            return record
        response, problem = upstream_checks.parse_completion(record.operation, data)
        if problem is not None:
            self._upstream_failed(
                responder, record, span_id, None, extra_headers, status=200, body=data, problem=problem
            )
            return record
        record.response = response
        if dialect is not None and response is not None:
            translated = dialect.from_chat(response, api_body)
            record.extra[semconv.GEN_AI_RESPONSE_ID] = translated["id"]
            data = orjson.dumps(translated)
        await self._record_answered(record, span_id)
        responder.send(200, data, out_headers)
        return record

    def _upstream_failed(
        self,
        responder: Responder,
        record: CallRecord,
        span_id: str,
        exc: Exception | None,
        extra_headers: list[tuple[str, str]] | None = None,
        *,
        status: int | None = None,
        body: bytes = b"",
        problem: str | None = None,
    ) -> None:
        self.counters["upstream_errors"] += 1
        record.end_ns = record.end_ns or time.time_ns()
        code, http_status, message = upstream_checks.failure(exc, status, body, problem)
        record.status = http_status
        record.error_type = UPSTREAM_ERROR
        record.error_message = message
        record.extra["agentbolt.llm.upstream_error"] = code
        self._reply(
            responder, http_status, message, UPSTREAM_ERROR, [(SPAN_HEADER, span_id), *(extra_headers or ())], code
        )
        self._record(record, span_id)

    def _record(self, record: CallRecord, span_id: str) -> None:
        self._spans.record(record, span_id)

    async def _record_answered(self, record: CallRecord, span_id: str) -> None:
        """Record an answered call: with ``durable_calls``, append its span to the call log, or
        without one wait until it is in the store (the answer's last byte goes out after that);
        else queue it like any span."""
        if self.call_log is not None:
            await self._spans.log(record, span_id)
        elif self.durable_calls:
            await self._spans.write(record, span_id)
        else:
            self._spans.record(record, span_id)

    # -- control endpoints (for a gateway in another process) ------------------------------------

    async def _control(self, request: Request, responder: Responder, sub: str) -> None:
        if sub == "/gateway/health":  # liveness; readiness is GET /ready
            body = {"status": "ok", "paused": self.paused, "ready": self.not_ready() is None}
            return responder.send(200, orjson.dumps(body))
        if self.token is not None and not self._authorized(request):
            return self._reply(responder, 401, "missing or wrong bearer token", "authentication_error")
        if sub == "/gateway/stats" and request.method == "GET":
            return responder.send(200, orjson.dumps(self.stats()))
        model = control.BODIES.get(sub)
        if model is None:
            return self._reply(responder, 404, f"no control route {sub}", "invalid_request_error")
        if request.method != "POST":
            return self._reply(responder, 405, f"{sub} takes POST", "invalid_request_error")
        if self.token is None and not control.is_json(request.headers.get("content-type")):
            # A web page can send a cross-site POST with a form content type, never with JSON
            # (that needs a CORS preflight, which the gateway never approves).
            return self._reply(
                responder, 415, "send the body as JSON with 'Content-Type: application/json'", "invalid_request_error"
            )
        try:
            args: Any = model.model_validate_json(request.body or b"{}")
        except ValidationError as exc:
            return self._reply(responder, 422, control.validation_message(exc), "invalid_request_error")
        if isinstance(args, control.DrainRequest):
            ok = await self.drain(args.timeout)
            return responder.send(200, orjson.dumps({"drained": ok}))
        if sub == "/gateway/pause":
            self.pause()
        elif sub == "/gateway/resume":
            self.resume()
        elif sub == "/gateway/flush":
            await self.flush()
        elif isinstance(args, control.PolicyRequest):
            self.set_policy(version=args.version, sampling=args.sampling, model=args.model)
        elif isinstance(args, control.UpstreamsRequest):
            self.set_upstreams([Upstream(**u.model_dump()) for u in args.upstreams])
        responder.send(200, orjson.dumps(self.stats()))
