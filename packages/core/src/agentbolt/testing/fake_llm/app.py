"""The fake server as a bare ASGI application (no framework on the hot path; orjson only).

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /v1/models``,
``GET /health``, and the control routes ``GET /_fake/requests`` (the request log as JSON) and
``DELETE /_fake/requests`` (clear it).

Use it without sockets through ``httpx.ASGITransport(app=FakeLLMApp(backend))``; there a
``drop`` failure raises :class:`ConnectionResetError` into the client, since no socket exists.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson

from .backend import Choice, FakeLLM, HTTPError, Params, unique_id
from .request_log import RecordedRequest
from .tokenizer import CHAR_BASE, FakeTokenizer, prompt_key, token_logprob, top_logprobs

__all__ = ["CONFIG_ENV", "FakeLLMApp", "app_from_env"]

logger = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

CONFIG_ENV = "AGENTBOLT_FAKE_LLM_CONFIG"
"""Environment variable holding the JSON configuration read by :func:`app_from_env`."""

_JSON = [(b"content-type", b"application/json")]
_SSE = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
_DONE = b"data: [DONE]\n\n"
_STARTED = int(time.time())


class _Client:
    """One request's connection: notices the client leaving while the server waits."""

    __slots__ = ("_gone", "receive", "send")

    def __init__(self, receive: Receive, send: Send) -> None:
        self.receive = receive
        self.send = send
        self._gone: asyncio.Future[Message] | None = None

    def _gone_future(self) -> asyncio.Future[Message]:
        if self._gone is None:
            self._gone = asyncio.ensure_future(self.receive())
        return self._gone

    async def sleep(self, seconds: float, app: FakeLLMApp) -> bool:
        """Wait ``seconds``; False if the client left or the server is closing first."""
        gone = self._gone_future()
        if gone.done() or app.closing:
            return False
        sleeper = asyncio.ensure_future(asyncio.sleep(seconds))
        app._sleepers.add(sleeper)
        try:
            waiting: set[asyncio.Future[Any]] = {sleeper, gone}
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        finally:
            app._sleepers.discard(sleeper)
        if sleeper in done and not sleeper.cancelled():
            return True
        sleeper.cancel()
        return False

    async def drop(self) -> None:
        """Close the connection without (the rest of) a response."""
        transport = getattr(getattr(self.send, "__self__", None), "transport", None)
        if transport is None:  # not served by uvicorn (e.g. httpx.ASGITransport): no socket to close
            raise ConnectionResetError("the fake LLM dropped the connection (injected failure)")
        transport.close()
        # Let the server notice the disconnect, so it does not answer in our place.
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._gone_future()), 1.0)

    def close(self) -> None:
        if self._gone is not None and not self._gone.done():
            self._gone.cancel()


class FakeLLMApp:
    """ASGI application answering OpenAI-compatible requests from a :class:`FakeLLM`."""

    def __init__(self, backend: FakeLLM | None = None) -> None:
        self.backend = backend if backend is not None else FakeLLM()
        """The backend that decides every answer."""
        self.closing = False
        """Set by :meth:`close`: waits (latency, hangs) end at once."""
        self._sleepers: set[asyncio.Future[Any]] = set()

    def close(self) -> None:
        """End every pending wait now (call from the server's event loop before stopping it)."""
        self.closing = True
        for sleeper in list(self._sleepers):
            sleeper.cancel()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        method: str = scope["method"]
        path: str = scope["path"]
        body = b""
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # client left before sending its body
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if path == "/health":
            await _respond(send, 200, b"")
            return
        if path.startswith("/_fake/"):
            await self._control(method, path, send)
            return
        backend = self.backend
        headers = _headers(scope)
        try:
            data = orjson.loads(body) if body else None
            bad_json = False
        except orjson.JSONDecodeError:
            data, bad_json = None, True
        if backend.config.record:
            backend.requests.append(RecordedRequest(method, path, headers, data))
        client = _Client(receive, send)
        try:
            if path in ("/v1/chat/completions", "/v1/completions"):
                if method != "POST":
                    raise HTTPError(405, f"{method} is not allowed on {path}; use POST")
                if bad_json:
                    raise HTTPError(400, "the request body is not valid JSON")
                await self._completion(
                    "chat" if path == "/v1/chat/completions" else "completion", data, headers, client
                )
            elif path == "/v1/models":
                model = {"id": backend.model, "object": "model", "created": _STARTED, "owned_by": "agentbolt"}
                await _respond(send, 200, orjson.dumps({"object": "list", "data": [model]}))
            else:
                raise HTTPError(404, f"no route for {method} {path}")
        except HTTPError as exc:
            await _respond(send, exc.status, orjson.dumps(exc.body))
        finally:
            client.close()

    async def _control(self, method: str, path: str, send: Send) -> None:
        log = self.backend.requests
        if path == "/_fake/requests" and method == "GET":
            await _respond(send, 200, orjson.dumps([r.to_dict() for r in log.snapshot()]))
        elif path == "/_fake/requests" and method == "DELETE":
            count = len(log)
            log.clear()
            await _respond(send, 200, orjson.dumps({"cleared": count}))
        else:
            await _respond(send, 404, orjson.dumps(HTTPError(404, f"no route for {method} {path}").body))

    def _gone(self) -> None:
        """A wait ended early: answer 503 if the server is closing (else the client left)."""
        if self.closing:
            raise HTTPError(503, "the fake LLM server is shutting down")

    async def _completion(self, kind: Any, data: Any, headers: dict[str, str], client: _Client) -> None:
        backend = self.backend
        try:
            request, params = backend.parse(kind, data, headers)
            delay = backend.latency_for(request)
        except HTTPError:
            raise
        except Exception as exc:  # a bug or a failing latency callable: answer 500 and say why
            logger.exception("fake LLM failed to handle a request")
            raise HTTPError(500, f"fake LLM failed: {exc!r}") from exc
        if delay > 0 and not await client.sleep(delay, self):
            return self._gone()
        failure = backend.failure_for(request)
        if failure is not None:
            logger.debug("injecting %s failure into %s %s", failure.kind, kind, request.model)
            if failure.kind == "status":
                raise HTTPError(failure.status, failure.message, type=failure.error_type)
            if failure.kind == "drop":
                await client.drop()
                return
            if failure.kind == "timeout" and not await client.sleep(failure.hang_s, self):
                return self._gone()
        try:
            render = _Renderer(backend.tokenizer, params, backend.generate(request, params))
            payload: list[bytes] | bytes = render.events() if params.stream else orjson.dumps(render.response())
        except Exception as exc:  # a reply callable failed: answer 500 and say why
            logger.exception("fake LLM failed to generate a reply")
            raise HTTPError(500, f"fake LLM reply failed: {exc!r}") from exc
        drop_at = failure.after_chunks if failure is not None and failure.kind == "drop_mid_stream" else None
        if isinstance(payload, list):
            await self._stream(payload, client, drop_at)
        elif drop_at is None:
            await _respond(client.send, 200, payload)
        else:
            await client.send({"type": "http.response.start", "status": 200, "headers": _with_length(_JSON, payload)})
            await client.send({"type": "http.response.body", "body": payload[: len(payload) // 2], "more_body": True})
            await client.drop()

    async def _stream(self, events: list[bytes], client: _Client, drop_at: int | None) -> None:
        send = client.send
        await send({"type": "http.response.start", "status": 200, "headers": _SSE})
        delay = self.backend.config.token_latency_s
        if drop_at is None and delay <= 0:
            await send({"type": "http.response.body", "body": b"".join(events), "more_body": False})
            return
        for i, event in enumerate(events):
            if i == drop_at:
                await client.drop()
                return
            if i and delay > 0 and not await client.sleep(delay, self) and not self.closing:
                return  # the client left; when the server is closing, finish without delays
            await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class _Renderer:
    """Turns generated choices into OpenAI/vLLM JSON (one response, or SSE events)."""

    def __init__(self, tokenizer: FakeTokenizer, params: Params, choices: list[Choice]) -> None:
        self.tok = tokenizer
        self.p = params
        self.choices = choices
        self.chat = params.kind == "chat"
        self.id = unique_id("chatcmpl-" if self.chat else "cmpl-")
        self.created = int(time.time())
        self.keys = [prompt_key(ids) for ids, _ in params.prompts] if params.logprobs else []

    def _token(self, token_id: int) -> str:
        return f"token_id:{token_id}" if self.p.tokens_as_ids else self.tok.token_text(token_id)

    def _usage(self) -> dict[str, int]:
        prompt = sum(len(ids) for ids, _ in self.p.prompts)
        completion = sum(len(c.token_ids) for c in self.choices)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def _logprobs(self, choice: Choice, start: int, ids: list[int], offset: int) -> tuple[Any, int]:
        """Logprobs of ``ids`` at response positions ``start...``; returns them and the next text offset."""
        key = self.keys[choice.prompt_index]
        k = self.p.top_logprobs
        if self.chat:
            content = []
            for i, t in enumerate(ids):
                token = self._token(t)
                if k:
                    tops = top_logprobs(key, start + i, t, k)
                    lp = tops[0][1]
                    top = [{"token": (s := self._token(a)), "logprob": x, "bytes": list(s.encode())} for a, x in tops]
                else:
                    lp, top = token_logprob(key, start + i, t), []
                content.append({"token": token, "logprob": lp, "bytes": list(token.encode()), "top_logprobs": top})
            return {"content": content}, offset
        tokens, token_logprobs, tops_out, offsets = [], [], [], []
        for i, t in enumerate(ids):
            tops = top_logprobs(key, start + i, t, max(k, 1))
            tokens.append(self._token(t))
            token_logprobs.append(tops[0][1])
            tops_out.append({self._token(a): lp for a, lp in tops})
            offsets.append(offset)
            if t >= CHAR_BASE:
                offset += len(self.tok.token_text(t))
        logprobs = {
            "tokens": tokens,
            "token_logprobs": token_logprobs,
            "top_logprobs": tops_out,
            "text_offset": offsets,
        }
        return logprobs, offset

    def response(self) -> dict[str, Any]:
        """The non-streaming response body."""
        p = self.p
        out = []
        for c in self.choices:
            logprobs = self._logprobs(c, 0, c.token_ids, 0)[0] if p.logprobs else None
            if self.chat:
                message: dict[str, Any] = {"role": "assistant", "content": c.text}
                if c.tool_calls is not None:
                    message["content"] = c.text or None
                    message["tool_calls"] = c.tool_calls
                choice: dict[str, Any] = {
                    "index": c.index,
                    "message": message,
                    "logprobs": logprobs,
                    "finish_reason": c.finish_reason,
                }
            else:
                choice = {"index": c.index, "text": c.text, "logprobs": logprobs, "finish_reason": c.finish_reason}
                if p.return_token_ids:
                    choice["prompt_token_ids"] = p.prompts[c.prompt_index][0]
            if p.return_token_ids:
                choice["token_ids"] = c.token_ids
            out.append(choice)
        body: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": p.model,
            "choices": out,
            "usage": self._usage(),
        }
        if self.chat and p.return_token_ids:
            body["prompt_token_ids"] = p.prompts[0][0]
        return body

    def events(self) -> list[bytes]:
        """The streaming response: ``data: {chunk}\\n\\n`` events, ending with ``data: [DONE]``."""
        p = self.p
        chat = self.chat
        head = (
            b'{"id":'
            + orjson.dumps(self.id)
            + b',"object":'
            + (b'"chat.completion.chunk"' if chat else b'"text_completion"')
            + b',"created":'
            + str(self.created).encode()
            + b',"model":'
            + orjson.dumps(p.model)
            + (b',"usage":null' if p.include_usage else b"")
        )
        events: list[bytes] = []

        def emit(choice: dict[str, Any], extra: bytes = b"") -> None:
            events.append(b"data: " + head + extra + b',"choices":[' + orjson.dumps(choice) + b"]}\n\n")

        needs_prompt = set(range(len(self.choices))) if p.return_token_ids and not chat else set()
        position = [0] * len(self.choices)
        offset = [0] * len(self.choices)

        def choice_obj(c: Choice, delta: Any, ids: list[int], finish: str | None) -> dict[str, Any]:
            logprobs = None
            if p.logprobs and ids:
                logprobs, offset[c.index] = self._logprobs(c, position[c.index], ids, offset[c.index])
            position[c.index] += len(ids)
            obj: dict[str, Any] = (
                {"index": c.index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
                if chat
                else {"index": c.index, "text": delta, "logprobs": logprobs, "finish_reason": finish}
            )
            if p.return_token_ids:
                obj["token_ids"] = ids
                if c.index in needs_prompt:
                    needs_prompt.discard(c.index)
                    obj["prompt_token_ids"] = p.prompts[c.prompt_index][0]
            return obj

        if chat:
            prompt_extra = b',"prompt_token_ids":' + orjson.dumps(p.prompts[0][0]) if p.return_token_ids else b""
            for i, c in enumerate(self.choices):
                role = {"role": "assistant", "content": None if c.tool_calls is not None else ""}
                emit(choice_obj(c, role, [], None), prompt_extra if i == 0 else b"")
        longest = max((len(c.pieces) for c in self.choices), default=0)
        for k in range(longest):
            for c in self.choices:
                if k < len(c.pieces):
                    delta, ids = c.pieces[k]
                    emit(choice_obj(c, delta, ids, None))
        for c in self.choices:
            emit(choice_obj(c, {} if chat else "", c.tail_ids, c.finish_reason))
        if p.include_usage:
            usage = orjson.dumps(self._usage())
            kind = b'"chat.completion.chunk"' if chat else b'"text_completion"'
            events.append(
                b'data: {"id":'
                + orjson.dumps(self.id)
                + b',"object":'
                + kind
                + b',"created":'
                + str(self.created).encode()
                + b',"model":'
                + orjson.dumps(p.model)
                + b',"choices":[],"usage":'
                + usage
                + b"}\n\n"
            )
        events.append(_DONE)
        return events


def _headers(scope: Scope) -> dict[str, str]:
    headers: dict[str, str] = {}
    for name, value in scope["headers"]:
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    return headers


def _with_length(headers: list[tuple[bytes, bytes]], body: bytes) -> list[tuple[bytes, bytes]]:
    return [*headers, (b"content-length", str(len(body)).encode())]


async def _respond(send: Send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": _with_length(_JSON, body)})
    await send({"type": "http.response.body", "body": body})


def app_from_env() -> FakeLLMApp:
    """An app configured from the JSON in ``$AGENTBOLT_FAKE_LLM_CONFIG`` (uvicorn factory for workers)."""
    raw = os.environ.get(CONFIG_ENV)
    return FakeLLMApp(FakeLLM.from_config(orjson.loads(raw) if raw else {}))
