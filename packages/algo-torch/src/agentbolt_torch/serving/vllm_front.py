"""The front of a vLLM server: admission, pause and the policy version of every call.

vLLM answers with the exact token ids and logprobs (``return_token_ids``, ``logprobs``) but cannot
say which weights generated a response. :class:`VLLMFront` is a small HTTP relay (Starlette on
uvicorn, in a thread of the trainer) between the gateway and vLLM that keeps what
:class:`~agentbolt_torch.generation.generator.Generator` promises:

- every response carries ``x-agentbolt-policy-version`` (the version of the weights vLLM held
  when the call was admitted) and, for a per-role adapter, ``x-agentbolt-policy`` (its name);
- while the generator is paused or swapping weights, new calls **wait** here (none fails, none
  reaches vLLM), and :meth:`AdmissionGate.wait_idle` drains the calls in flight;
- calls are counted (requests, choices, prompt and generated tokens of non-streamed answers).

Requests and answers are relayed unchanged, streamed or not.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..generation.engine_io import EngineStats
from .openai_routes import POLICY_NAME_HEADER, POLICY_VERSION_HEADER

__all__ = ["AdmissionGate", "VLLMFront"]

log = logging.getLogger(__name__)

_RELAYED = ("/v1/chat/completions", "/v1/completions")


@dataclass
class AdmissionGate:
    """Which calls may start, and the versions they are stamped with (thread-safe)."""

    versions: dict[str, int] = field(default_factory=dict)
    """Served version per model name (the base and each LoRA adapter vLLM holds)."""
    default_version: int = 0
    """Version of a model name not in :attr:`versions`."""
    adapters: frozenset[str] = frozenset()
    """Model names that are per-role adapters (named in ``x-agentbolt-policy``)."""
    paused: bool = False
    inflight: int = 0
    """Calls admitted and not finished."""
    waiting: int = 0
    """Calls waiting for admission (paused)."""
    stats: EngineStats = field(default_factory=EngineStats)
    _cond: threading.Condition = field(default_factory=threading.Condition)

    @property
    def by_model(self) -> bool:
        """Whether a call's version depends on its ``model`` (per-model versions or adapters);
        otherwise every call gets :attr:`default_version` and the relay need not parse the body."""
        return bool(self.versions or self.adapters)

    def try_admit(self, model: str | None) -> tuple[int, str | None] | None:
        """Admit a call for ``model`` unless paused: its version and adapter name (or ``None``)."""
        with self._cond:
            if self.paused:
                return None
            self.inflight += 1
            self.stats.requests += 1
            name = model or ""
            return self.versions.get(name, self.default_version), (name if name in self.adapters else None)

    def note_waiting(self, delta: int) -> None:
        """A call starts (``+1``) or stops (``-1``) waiting for admission."""
        with self._cond:
            self.waiting += delta

    def done(self) -> None:
        """A call admitted by :meth:`try_admit` finished (or failed)."""
        with self._cond:
            self.inflight -= 1
            self._cond.notify_all()

    def pause(self) -> None:
        """Stop admitting calls (they wait)."""
        with self._cond:
            self.paused = True

    def resume(self, versions: Mapping[str, int] | None = None, default_version: int | None = None) -> None:
        """Admit calls again, stamped with ``versions`` from now on when given."""
        with self._cond:
            if versions is not None:
                self.versions = dict(versions)
            if default_version is not None:
                self.default_version = default_version
            self.paused = False
            self._cond.notify_all()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no admitted call is in flight; ``False`` on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self.inflight == 0, timeout)

    def count_answer(self, body: Mapping[str, Any]) -> None:
        """Count the choices and tokens of a non-streamed answer."""
        usage = body.get("usage") or {}
        with self._cond:
            self.stats.sequences += len(body.get("choices") or ())
            self.stats.prompt_tokens += int(usage.get("prompt_tokens") or 0)
            self.stats.generated_tokens += int(usage.get("completion_tokens") or 0)
            details = usage.get("prompt_tokens_details") or {}
            self.stats.cached_prompt_tokens += int(details.get("cached_tokens") or 0)


def _model_of(raw: bytes) -> str | None:
    """The ``model`` of a request body (``None`` if it has none or is not JSON)."""
    try:
        body = json.loads(raw) if raw else {}
    except ValueError:
        return None
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) else None


class VLLMFront:
    """Relays ``/v1/chat/completions``, ``/v1/completions`` and ``/v1/models`` to the vLLM
    server at ``upstream`` (``http://host:port``), through ``gate``; listens on ``host:port``."""

    def __init__(self, upstream: str, gate: AdmissionGate, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.upstream = upstream
        self.gate = gate
        self.host = host
        self.port = port
        self._thread: Any = None
        self._client: Any = None

    @property
    def base_url(self) -> str:
        """The OpenAI base URL: ``http://host:port/v1``."""
        return f"http://{self.host}:{self.port}/v1"

    def _app(self) -> Any:
        import httpx
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import JSONResponse, Response, StreamingResponse
        from starlette.routing import Route

        async def client() -> httpx.AsyncClient:
            if self._client is None:
                limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
                self._client = httpx.AsyncClient(base_url=self.upstream, timeout=None, limits=limits)
            return self._client

        async def relay(request: Request) -> Response:
            raw = await request.body()
            model = _model_of(raw) if self.gate.by_model else None  # parse the body only when it matters
            admitted = self.gate.try_admit(model)
            if admitted is None:  # paused: the call waits (an update or a swap is running)
                self.gate.note_waiting(1)
                try:
                    # resume() comes from another thread (the trainer's): poll, 10 ms, only while paused
                    while (admitted := self.gate.try_admit(model)) is None:  # noqa: ASYNC110
                        await asyncio.sleep(0.01)
                finally:
                    self.gate.note_waiting(-1)
            version, adapter = admitted
            headers = {POLICY_VERSION_HEADER: str(version)}
            if adapter is not None:
                headers[POLICY_NAME_HEADER] = adapter
            try:
                http = await client()
                upstream = http.build_request(
                    "POST", request.url.path, content=raw, headers={"content-type": "application/json"}
                )
                answer = await http.send(upstream, stream=True)
            except BaseException:
                self.gate.done()
                raise
            media = answer.headers.get("content-type", "application/json")
            if media.startswith("text/event-stream"):

                async def chunks() -> AsyncIterator[bytes]:
                    try:
                        async for chunk in answer.aiter_raw():
                            yield chunk
                    finally:
                        await answer.aclose()
                        self.gate.done()

                return StreamingResponse(chunks(), status_code=answer.status_code, media_type=media, headers=headers)
            try:
                content = await answer.aread()
            finally:
                await answer.aclose()
                self.gate.done()
            if answer.status_code == 200:
                try:
                    self.gate.count_answer(json.loads(content))
                except ValueError:
                    pass
            return Response(content, status_code=answer.status_code, media_type=media, headers=headers)

        async def passthrough(request: Request) -> Response:
            http = await client()
            answer = await http.get(request.url.path)
            return Response(
                answer.content, status_code=answer.status_code, media_type=answer.headers.get("content-type")
            )

        async def health(request: Request) -> Response:
            return JSONResponse({"paused": self.gate.paused, "inflight": self.gate.inflight})

        routes = [Route(path, relay, methods=["POST"]) for path in _RELAYED]
        routes += [Route("/v1/models", passthrough), Route("/health", health)]
        return Starlette(routes=routes)

    def start(self, timeout: float = 30.0) -> None:
        """Start serving (returns once the socket accepts connections)."""
        import uvicorn

        from agentbolt.store.server.uvicorn_thread import UvicornThread

        if self._thread is not None:
            return
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self._app(), log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=5
        )
        self._thread = UvicornThread(uvicorn.Server(config), sock, name="agentbolt-vllm-front")
        started = time.monotonic()
        self._thread.start(timeout)
        log.debug("vLLM front on %s after %.2f s", self.base_url, time.monotonic() - started)

    def stop(self) -> None:
        """Stop serving (idempotent)."""
        if self._thread is not None:
            self._thread.stop(10)
            self._thread = None
        self._client = None
