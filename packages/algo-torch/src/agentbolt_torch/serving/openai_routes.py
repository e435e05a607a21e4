"""The policy server's OpenAI-compatible routes (vLLM-style token ids and logprobs).

:func:`create_app` builds the ASGI app; each route is a method of :class:`PolicyRoutes`;
:class:`~agentbolt_torch.serving.server.PolicyServer` runs the app with uvicorn on a background thread:

- ``POST /v1/chat/completions`` and ``POST /v1/completions``: ``n``, ``max_tokens``
  (``max_completion_tokens``), ``temperature`` (0 = greedy), ``top_p``, ``stop``, ``seed``,
  ``stream`` (SSE chunks in OpenAI's format, ``stream_options.include_usage``), ``logprobs``,
  ``top_logprobs``, ``tools``/``tool_choice`` (chat; ``required`` or a named function forces
  the start of a ``<tool_call>`` block, as prompt tokens), ``echo`` (completions), plus the vLLM
  extensions ``return_token_ids``, ``top_k``, ``stop_token_ids``, ``ignore_eos``,
  ``include_stop_str_in_output``, ``skip_special_tokens``, ``add_generation_prompt``,
  ``continue_final_message``, ``chat_template_kwargs``, ``add_special_tokens``.
  ``presence_penalty``, ``frequency_penalty``, ``repetition_penalty`` and ``logit_bias`` are
  accepted and ignored (they would change the sampling distribution away from the policy;
  a warning is logged once).
- ``GET /v1/models``: the served model, with ``max_model_len`` and ``policy_version``.
- ``GET /health`` and ``GET /stats``: liveness, pause state, engine counters.

Token ids and logprobs, in vLLM's shapes:

- ``return_token_ids: true`` -> chat: top-level ``prompt_token_ids`` and ``choices[i].token_ids``;
  completions: ``choices[i].prompt_token_ids`` and ``choices[i].token_ids``. Streaming: the
  first chunk carries ``prompt_token_ids`` (chat: top level; completions: in each choice's
  first chunk) and every chunk's choice carries its delta ``token_ids``.
- ``token_ids`` include the final eos / stop token; ``logprobs.content`` (chat) and
  ``logprobs.tokens`` (completions) have exactly one entry per token id, in the same order.
- The logprob of a token is that of the raw policy (temperature 1) by default; see
  :mod:`agentbolt_torch.generation.engine` for the convention and the ``processed`` alternative.

Every response carries the header ``x-agentbolt-policy-version`` (and a ``policy_version``
field in the body / first chunk): the policy version when the request started generating.
The model name in a request is not checked; responses name the served model.

**Policies by role** (a :class:`~agentbolt_torch.policy.Policy` with several adapters): the
request's ``model`` picks the adapter, as vLLM serves LoRA adapters: an adapter's name runs the
request with that adapter, the served (base) model's name runs it on the base model alone, any
other name is a 404 listing the served names. ``/v1/models`` lists the base model and each
adapter (``parent``: the base). A response of an adapter carries ``x-agentbolt-policy`` (its name)
and the adapter's own version in ``x-agentbolt-policy-version`` (and ``policy_version``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from agentbolt.errors import UserError

from ..chat import ToolCallStreamFilter, parse_tool_calls, render_request
from ..generation.engine import Completion, Finished, GenerationEngine, RequestHandle, SamplingParams, TokenStep
from ..generation.token_text import TokenText, decode_text

__all__ = ["POLICY_VERSION_HEADER", "PolicyRoutes", "create_app"]

logger = logging.getLogger(__name__)

POLICY_VERSION_HEADER = "x-agentbolt-policy-version"
"""Response header carrying the policy version that served the request."""
POLICY_NAME_HEADER = "x-agentbolt-policy"
"""Response header naming the adapter (policy by role) that served the request."""

_IGNORED_PARAMS = ("presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias", "min_p")


class _HTTPError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind


# --------------------------------------------------------------------------------------------
# Request parsing
# --------------------------------------------------------------------------------------------


def _get(body: Mapping[str, Any], key: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
    value = body.get(key, default)
    if value is None:
        return default
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, bool) and kind is not bool and (kind is int or kind is float):
        raise _HTTPError(400, f"'{key}' must be a number", key)
    if not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise _HTTPError(400, f"'{key}' must be of type {names}", key)
    return value


def _sampling_params(body: Mapping[str, Any], *, chat: bool, warned: set[str]) -> tuple[SamplingParams, int]:
    for name in _IGNORED_PARAMS:
        value = body.get(name)
        if value not in (None, 0, 0.0, 1.0, {}) and name not in warned:
            warned.add(name)
            logger.warning("the policy server ignores %r (sampling stays on the policy's distribution)", name)
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and (not isinstance(stop, list) or not all(isinstance(s, str) for s in stop)):
        raise _HTTPError(400, "'stop' must be a string or a list of strings", "stop")
    if stop and len(stop) > 16:
        raise _HTTPError(400, "at most 16 stop strings are supported", "stop")
    max_tokens = _get(body, "max_completion_tokens", int) if chat else None
    if max_tokens is None:
        max_tokens = _get(body, "max_tokens", int)
    if chat:
        top_logprobs = _get(body, "top_logprobs", int, 0) if _get(body, "logprobs", bool, False) else 0
    else:
        top_logprobs = _get(body, "logprobs", int, 0)
    n = _get(body, "n", int, 1)
    top_k = _get(body, "top_k", int, 0)
    try:
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=_get(body, "temperature", float, 1.0),
            top_p=_get(body, "top_p", float, 1.0),
            top_k=max(top_k, 0),
            stop=tuple(s for s in (stop or []) if s),
            stop_token_ids=tuple(_get(body, "stop_token_ids", list, [])),
            ignore_eos=_get(body, "ignore_eos", bool, False),
            seed=_get(body, "seed", int),
            top_logprobs=top_logprobs,
            include_stop_str_in_output=_get(body, "include_stop_str_in_output", bool, False),
            skip_special_tokens=_get(body, "skip_special_tokens", bool, True),
        )
    except UserError as exc:
        raise _HTTPError(400, str(exc)) from exc
    return params, n


# --------------------------------------------------------------------------------------------
# The app
# --------------------------------------------------------------------------------------------


def _sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _usage(prompt_tokens: int, completions: Sequence[Completion]) -> dict[str, int]:
    completion_tokens = sum(len(c.token_ids) for c in completions)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _cancel(handles: Iterable[RequestHandle]) -> None:
    """Stop the requests (those already finished are left as they are)."""
    for h in handles:
        h.cancel()


async def _results(handles: Sequence[RequestHandle]) -> list[list[Completion]]:
    """Every request's completions, in order; the caller's cancellation cancels the requests."""
    try:
        return [await h.result() for h in handles]
    except asyncio.CancelledError:
        _cancel(handles)
        raise


def _include_usage(body: Mapping[str, Any]) -> bool:
    """A streaming request's ``stream_options.include_usage``."""
    return bool((_get(body, "stream_options", dict, {}) or {}).get("include_usage"))


async def _merged_events(handles: Sequence[RequestHandle]) -> AsyncIterator[tuple[int, TokenStep | Finished]]:
    """Events of several requests as they come: ``(request index, event)``."""
    if len(handles) == 1:
        async for event in handles[0].events():
            yield 0, event
        return
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
    done = object()

    async def pump(i: int, handle: RequestHandle) -> None:
        try:
            async for event in handle.events():
                await queue.put((i, event))
        except Exception as exc:
            await queue.put((i, exc))
        finally:
            await queue.put((i, done))

    tasks = [asyncio.create_task(pump(i, h)) for i, h in enumerate(handles)]
    try:
        remaining = len(tasks)
        while remaining:
            i, event = await queue.get()
            if event is done:
                remaining -= 1
            elif isinstance(event, Exception):
                raise event
            else:
                yield i, event
    finally:
        for task in tasks:
            task.cancel()


class PolicyRoutes:
    """The routes of the policy server over ``engine``: one method per endpoint."""

    def __init__(self, engine: GenerationEngine, *, served_model_name: str | None = None) -> None:
        self.engine = engine
        self.policy = engine.policy
        self.tokenizer = self.policy.tokenizer
        self.model_name = served_model_name or self.policy.name
        self.token_text = TokenText(self.tokenizer)
        self.created = int(time.time())
        self.warned: set[str] = set()
        """Ignored sampling parameters already warned about (once per server)."""

    def error_response(self, exc: _HTTPError) -> JSONResponse:
        body = {"error": {"message": exc.message, "type": exc.kind, "param": exc.param, "code": exc.status}}
        return JSONResponse(
            body, status_code=exc.status, headers={POLICY_VERSION_HEADER: str(self.engine.served_version)}
        )

    async def read_json(self, request: Request) -> dict[str, Any]:
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError as exc:
            raise _HTTPError(400, f"invalid JSON body: {exc}") from exc
        if not isinstance(body, dict):
            raise _HTTPError(400, "the request body must be a JSON object")
        return body

    def submit(self, prompt_ids: list[int], params: SamplingParams, n: int, adapter: str | None) -> RequestHandle:
        try:
            return self.engine.submit(prompt_ids, params, n, adapter=adapter)
        except UserError as exc:
            raise _HTTPError(400, str(exc)) from exc

    async def admit(
        self, prompts: Sequence[list[int]], params: SamplingParams, n: int, adapter: str | None
    ) -> tuple[list[RequestHandle], int]:
        """Submit one request per prompt and wait until every one generates: the requests and
        the oldest policy version they were admitted under. A failure, or the client going away,
        cancels them all."""
        handles: list[RequestHandle] = []
        try:
            for ids in prompts:
                handles.append(self.submit(ids, params, n, adapter))
            return handles, min([await h.admitted() for h in handles])
        except BaseException:
            _cancel(handles)
            raise

    def adapter_for(self, body: Mapping[str, Any]) -> str | None:
        """The adapter a request's ``model`` asks for (policies by role); ``None`` for a single
        policy (the model name is not checked) and for the base model."""
        adapters = self.policy.adapters
        if not adapters:
            return None
        model = body.get("model")
        if model in adapters:
            return str(model)
        if model in (None, self.model_name):
            return None
        served = ", ".join([self.model_name, *adapters])
        raise _HTTPError(404, f"The model {model!r} does not exist; served: {served}", "model", "NotFoundError")

    def headers(self, adapter: str | None, version: int) -> dict[str, str]:
        """The policy headers of a response generated by ``adapter`` at ``version``."""
        headers = {POLICY_VERSION_HEADER: str(version)}
        if adapter is not None:
            headers[POLICY_NAME_HEADER] = adapter
        return headers

    async def on_error(self, request: Request, exc: Exception) -> JSONResponse:
        """A request error as OpenAI's error body; a :class:`UserError` (a bad request found by the
        engine, e.g. a prompt over the context) as a 400. (Registered for those two types only.)"""
        return self.error_response(exc if isinstance(exc, _HTTPError) else _HTTPError(400, str(exc)))

    async def models(self) -> JSONResponse:
        """``GET /v1/models``: the served model, its context length and policy version."""
        card = {
            "id": self.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "agentbolt",
            "root": self.model_name,
            "max_model_len": self.policy.max_model_len,
            "policy_version": self.engine.served_version,
        }
        cards = [card]
        for name in self.policy.adapters:  # vLLM lists LoRA adapters beside their base model this way
            cards.append(
                {
                    **card,
                    "id": name,
                    "root": name,
                    "parent": self.model_name,
                    "policy_version": self.engine.served_version_of(name),
                }
            )
        return JSONResponse(
            {"object": "list", "data": cards}, headers={POLICY_VERSION_HEADER: str(self.engine.served_version)}
        )

    async def health(self) -> dict[str, Any]:
        """``GET /health``: liveness, pause state, active and queued requests."""
        return {
            "status": "paused" if self.engine.is_paused else "ok",
            "policy_version": self.engine.served_version,
            "active_sequences": self.engine.num_active,
            "queued_requests": self.engine.num_queued,
        }

    async def stats(self) -> dict[str, Any]:
        """``GET /stats``: the engine's counters."""
        return {"policy_version": self.engine.served_version, **self.engine.stats.as_dict()}

    async def chat_completions(self, request: Request) -> Any:
        """``POST /v1/chat/completions`` (streaming or not, tools, token ids, logprobs)."""
        body = await self.read_json(request)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _HTTPError(400, "'messages' must be a non-empty list", "messages")
        params, n = _sampling_params(body, chat=True, warned=self.warned)
        tools = body.get("tools") or None
        if tools is not None and not isinstance(tools, list):
            raise _HTTPError(400, "'tools' must be a list", "tools")
        # tool_choice "required" / a named function: the reply's forced start goes on the prompt side
        rendered = render_request(
            self.tokenizer,
            messages,
            tools,
            body.get("tool_choice"),
            add_generation_prompt=_get(body, "add_generation_prompt", bool, True),
            continue_final_message=_get(body, "continue_final_message", bool, False),
            chat_template_kwargs=_get(body, "chat_template_kwargs", dict, None),
        )
        use_tools, forced = rendered.use_tools, rendered.forced
        prompt_ids = self.tokenizer(rendered.text, add_special_tokens=False)["input_ids"]
        return_ids = _get(body, "return_token_ids", bool, False)
        want_logprobs = _get(body, "logprobs", bool, False)
        adapter = self.adapter_for(body)
        (handle,), version = await self.admit([prompt_ids], params, n, adapter)
        response_id = f"chatcmpl-{handle.request_id:x}{int(time.time() * 1000):x}"
        headers = self.headers(adapter, version)
        if _get(body, "stream", bool, False):
            include_usage = _include_usage(body)
            stream = self._chat_stream(
                handle, response_id, version, prompt_ids, use_tools, want_logprobs, return_ids, include_usage, forced
            )
            return StreamingResponse(stream, media_type="text/event-stream", headers=headers)
        (outputs,) = await _results([handle])
        choices = []
        for out in outputs:
            content: str | None = out.text
            tool_calls: list[dict[str, Any]] = []
            finish_reason = out.finish_reason
            if use_tools:
                content = forced + out.text
                parsed = parse_tool_calls(content)
                if parsed.tool_calls:
                    content, tool_calls, finish_reason = parsed.content, parsed.tool_calls, "tool_calls"
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if tool_calls:
                message["tool_calls"] = tool_calls
            choice: dict[str, Any] = {
                "index": out.index,
                "message": message,
                "logprobs": (
                    {
                        "content": [
                            self.token_text.chat_entry(t, lp, out.top_logprobs[i] if out.top_logprobs else None)
                            for i, (t, lp) in enumerate(zip(out.token_ids, out.logprobs, strict=True))
                        ]
                    }
                    if want_logprobs
                    else None
                ),
                "finish_reason": finish_reason,
                "stop_reason": out.stop_reason,
            }
            if return_ids:
                choice["token_ids"] = out.token_ids
            choices.append(choice)
        payload: dict[str, Any] = {
            "id": response_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": choices,
            "usage": _usage(len(prompt_ids), outputs),
            "system_fingerprint": f"agentbolt-policy-v{version}",
            "policy_version": version,
        }
        if return_ids:
            payload["prompt_token_ids"] = prompt_ids
        return JSONResponse(payload, headers=headers)

    async def _chat_stream(
        self,
        handle: RequestHandle,
        response_id: str,
        version: int,
        prompt_ids: list[int],
        use_tools: bool,
        want_logprobs: bool,
        return_ids: bool,
        include_usage: bool,
        forced: str = "",
    ) -> AsyncIterator[bytes]:
        created_at = int(time.time())
        base = {"id": response_id, "object": "chat.completion.chunk", "created": created_at, "model": self.model_name}
        filters = [ToolCallStreamFilter() if use_tools else None for _ in range(handle.n)]
        for filt in filters:
            if filt is not None and forced:
                filt.feed(forced)  # held back: it opens a tool call
        try:
            for i in range(handle.n):
                first: dict[str, Any] = {
                    **base,
                    "choices": [
                        {
                            "index": i,
                            "delta": {"role": "assistant", "content": ""},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    ],
                }
                if i == 0:
                    first["policy_version"] = version
                    if return_ids:
                        first["prompt_token_ids"] = prompt_ids
                yield _sse(first)
            async for event in handle.events():
                filt = filters[event.choice]
                if isinstance(event, TokenStep):
                    text = filt.feed(event.text) if filt is not None else event.text
                    choice: dict[str, Any] = {
                        "index": event.choice,
                        "delta": {"content": text} if text else {},
                        "logprobs": (
                            {"content": [self.token_text.chat_entry(event.token_id, event.logprob, event.top_logprobs)]}
                            if want_logprobs
                            else None
                        ),
                        "finish_reason": None,
                    }
                    if return_ids:
                        choice["token_ids"] = [event.token_id]
                    yield _sse({**base, "choices": [choice]})
                    continue
                out = event.output
                finish_reason = out.finish_reason
                if filt is not None:
                    filt.feed(event.text)
                    rest, calls = filt.finish(forced + out.text)
                    if rest:
                        yield _sse({**base, "choices": [_empty_choice(event.choice, {"content": rest}, return_ids)]})
                    if calls:
                        finish_reason = "tool_calls"
                        deltas = [{"index": k, **call} for k, call in enumerate(calls)]
                        yield _sse(
                            {**base, "choices": [_empty_choice(event.choice, {"tool_calls": deltas}, return_ids)]}
                        )
                    delta: dict[str, Any] = {}
                else:
                    delta = {"content": event.text} if event.text else {}
                final = _empty_choice(event.choice, delta, return_ids)
                final["finish_reason"] = finish_reason
                final["stop_reason"] = out.stop_reason
                yield _sse({**base, "choices": [final]})
            if include_usage:
                outputs = [o for o in handle.outputs if o is not None]
                yield _sse({**base, "choices": [], "usage": _usage(len(prompt_ids), outputs)})
            yield b"data: [DONE]\n\n"
        finally:
            _cancel([handle])

    async def completions(self, request: Request) -> Any:
        """``POST /v1/completions`` (streaming or not, ``echo``, token ids, logprobs)."""
        body = await self.read_json(request)
        params, n = _sampling_params(body, chat=False, warned=self.warned)
        prompts = _completion_prompts(body.get("prompt"))
        add_special = _get(body, "add_special_tokens", bool, True)
        echo = _get(body, "echo", bool, False)
        if echo and body.get("logprobs") is not None:
            raise _HTTPError(400, "echo together with logprobs is not supported", "echo")
        want_logprobs = body.get("logprobs") is not None
        return_ids = _get(body, "return_token_ids", bool, False)
        encoded: list[tuple[str, list[int]]] = []
        for prompt in prompts:
            if isinstance(prompt, str):
                encoded.append((prompt, self.tokenizer(prompt, add_special_tokens=add_special)["input_ids"]))
            else:
                encoded.append((decode_text(self.tokenizer, prompt) if echo else "", list(prompt)))
        adapter = self.adapter_for(body)
        handles, version = await self.admit([ids for _, ids in encoded], params, n, adapter)
        response_id = f"cmpl-{handles[0].request_id:x}{int(time.time() * 1000):x}"
        headers = self.headers(adapter, version)
        prompt_tokens = sum(len(ids) for _, ids in encoded)
        if _get(body, "stream", bool, False):
            include_usage = _include_usage(body)
            stream = self._completion_stream(
                handles, encoded, response_id, version, echo, want_logprobs, return_ids, include_usage, prompt_tokens
            )
            return StreamingResponse(stream, media_type="text/event-stream", headers=headers)
        results = await _results(handles)
        choices = []
        all_outputs: list[Completion] = []
        for p, ((prompt_text, prompt_ids), outputs) in enumerate(zip(encoded, results, strict=True)):
            for out in outputs:
                all_outputs.append(out)
                prefix = prompt_text if echo else ""
                choice: dict[str, Any] = {
                    "index": p * n + out.index,
                    "text": prefix + out.text,
                    "logprobs": (
                        self.token_text.completion_logprobs(out.token_ids, out.logprobs, out.top_logprobs, len(prefix))
                        if want_logprobs
                        else None
                    ),
                    "finish_reason": out.finish_reason,
                    "stop_reason": out.stop_reason,
                }
                if return_ids:
                    choice["prompt_token_ids"] = prompt_ids
                    choice["token_ids"] = out.token_ids
                choices.append(choice)
        usage = _usage(prompt_tokens, all_outputs)
        payload = {
            "id": response_id,
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": choices,
            "usage": usage,
            "system_fingerprint": f"agentbolt-policy-v{version}",
            "policy_version": version,
        }
        return JSONResponse(payload, headers=headers)

    async def _completion_stream(
        self,
        handles: list[RequestHandle],
        encoded: list[tuple[str, list[int]]],
        response_id: str,
        version: int,
        echo: bool,
        want_logprobs: bool,
        return_ids: bool,
        include_usage: bool,
        prompt_tokens: int,
    ) -> AsyncIterator[bytes]:
        base = {"id": response_id, "object": "text_completion", "created": int(time.time()), "model": self.model_name}
        n = handles[0].n
        started: set[int] = set()
        offsets: dict[int, int] = {}
        first_chunk = True
        try:
            async for p, event in _merged_events(handles):
                index = p * n + event.choice
                choice: dict[str, Any] = {"index": index, "text": "", "logprobs": None, "finish_reason": None}
                if index not in started:
                    started.add(index)
                    if echo:
                        choice["text"] = encoded[p][0]
                    if return_ids:
                        choice["prompt_token_ids"] = encoded[p][1]
                    offsets[index] = len(choice["text"])
                if isinstance(event, TokenStep):
                    choice["text"] += event.text
                    if want_logprobs:
                        tops = [event.top_logprobs or []]
                        choice["logprobs"] = self.token_text.completion_logprobs(
                            [event.token_id], [event.logprob], tops, offsets[index]
                        )
                    offsets[index] += len(event.text)
                    if return_ids:
                        choice["token_ids"] = [event.token_id]
                else:
                    choice["text"] += event.text
                    choice["finish_reason"] = event.output.finish_reason
                    choice["stop_reason"] = event.output.stop_reason
                    if return_ids:
                        choice["token_ids"] = []
                chunk = {**base, "choices": [choice]}
                if first_chunk:
                    chunk["policy_version"] = version
                    first_chunk = False
                yield _sse(chunk)
            if include_usage:
                outputs = [o for h in handles for o in h.outputs if o is not None]
                yield _sse({**base, "choices": [], "usage": _usage(prompt_tokens, outputs)})
            yield b"data: [DONE]\n\n"
        finally:
            _cancel(handles)


def create_app(engine: GenerationEngine, *, served_model_name: str | None = None) -> FastAPI:
    """The OpenAI-compatible ASGI app over ``engine`` (started by the caller)."""
    routes = PolicyRoutes(engine, served_model_name=served_model_name)
    app = FastAPI(title="agentbolt policy server", version="1")
    app.state.engine = engine
    app.add_exception_handler(_HTTPError, routes.on_error)
    app.add_exception_handler(UserError, routes.on_error)
    app.add_api_route("/v1/models", routes.models, methods=["GET"])
    app.add_api_route("/health", routes.health, methods=["GET"])
    app.add_api_route("/stats", routes.stats, methods=["GET"])
    app.add_api_route("/v1/chat/completions", routes.chat_completions, methods=["POST"])
    app.add_api_route("/v1/completions", routes.completions, methods=["POST"])
    return app


def _empty_choice(index: int, delta: dict[str, Any], return_ids: bool) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
    if return_ids:
        choice["token_ids"] = []
    return choice


def _completion_prompts(prompt: Any) -> list[str | list[int]]:
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return list(prompt)
        if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
            return [list(prompt)]
        if all(isinstance(p, list) and p and all(isinstance(t, int) for t in p) for p in prompt):
            return [list(p) for p in prompt]
    raise _HTTPError(
        400, "'prompt' must be a string, a list of strings, a list of token ids or a list of such lists", "prompt"
    )
