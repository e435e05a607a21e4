"""What the fake server answers: rules applied, failures injected, requests logged, replies
generated. The configuration models are in :mod:`.config` and the request log in
:mod:`.request_log`.

Nothing here does I/O; :mod:`.app` turns a :class:`FakeLLM` into an ASGI application.
Configuration objects are frozen pydantic models (validated once, at construction); the
per-request path works on plain dicts and never validates with pydantic.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import random
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic_core import PydanticSerializationError

from agentbolt.errors import UserError

from .config import (
    DEFAULT_MODEL,
    DEFAULT_REPLY,
    Failure,
    FakeLLMConfig,
    Match,
    Reply,
    Rule,
    ToolCall,
    ToolCalls,
)
from .request_log import FakeRequest, RequestLog
from .tokenizer import IM_END, FakeTokenizer, _encode, content_text

__all__ = ["Choice", "FakeLLM", "HTTPError", "Params", "error_type_for", "unique_id"]

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------
# Generation results (consumed by the ASGI app)
# --------------------------------------------------------------------------------------------


class HTTPError(Exception):
    """An error answered with an OpenAI-style body: ``{"error": {message, type, param, code}}``."""

    def __init__(self, status: int, message: str, *, type: str | None = None, code: Any = None, param: Any = None):
        super().__init__(message)
        self.status = status
        self.body = {
            "error": {
                "message": message,
                "type": type or error_type_for(status),
                "param": param,
                "code": status if code is None else code,
            }
        }


def error_type_for(status: int) -> str:
    """OpenAI's ``error.type`` for an HTTP status."""
    if status >= 500:
        return "server_error"
    return {401: "authentication_error", 403: "permission_error", 404: "not_found_error", 429: "rate_limit_error"}.get(
        status, "invalid_request_error"
    )


@dataclass(slots=True)
class Params:
    """The sampling/output parameters of one request (parsed from its body)."""

    kind: Literal["chat", "completion"]
    model: str
    n: int
    max_tokens: int | None
    stop: list[str]
    stream: bool
    include_usage: bool
    return_token_ids: bool
    logprobs: bool
    top_logprobs: int
    tokens_as_ids: bool
    prompts: list[tuple[list[int], str]]
    """(prompt ids, prompt text) per prompt; chat has one, with the text left empty."""


@dataclass(slots=True)
class Choice:
    """One generated choice."""

    index: int
    prompt_index: int
    text: str
    """Content (chat) or text (completions); for a tool-call reply, the content before the calls."""
    tool_calls: list[dict[str, Any]] | None
    """OpenAI ``message.tool_calls`` of a tool-call reply."""
    pieces: list[tuple[Any, list[int]]]
    """Stream deltas with their token ids: ``{"content"|"tool_calls": ...}`` dicts (chat) or
    text (completions)."""
    token_ids: list[int]
    """Every response token, including a trailing end-of-sequence token."""
    tail_ids: list[int]
    """Tokens with no text of their own (the end-of-sequence token), sent with the finish chunk."""
    finish_reason: str


_ids = itertools.count()
_ID_PREFIX = os.urandom(6).hex()


def unique_id(prefix: str) -> str:
    """A unique id: ``prefix``, 12 random hex digits fixed per process, then a counter."""
    return f"{prefix}{_ID_PREFIX}{next(_ids):08x}"


def _compile_match(match: Match) -> Callable[[FakeRequest], bool]:
    if match is None:
        return lambda req: True
    if isinstance(match, re.Pattern):
        search = match.search
        return lambda req: search(req.text) is not None
    return lambda req: bool(match(req))


# --------------------------------------------------------------------------------------------
# The backend
# --------------------------------------------------------------------------------------------


class FakeLLM:
    """A scripted, rule-based fake model: what the fake OpenAI-compatible server answers.

    Example::

        llm = FakeLLM(
            rules=[
                Rule(match="weather", reply=ToolCalls([ToolCall("get_weather", {"city": "Paris"})])),
                Rule(match="shout", reply=lambda req: req.text.upper()),
            ],
            default_reply="I don't know.",
            failures=[Failure(kind="status", status=503, times=1)],
        )
        async with FakeLLMServer(llm) as server:
            client = AsyncOpenAI(base_url=server.base_url, api_key="x")

    The arguments are the fields of :class:`FakeLLMConfig`. One instance can back several
    servers; script positions and failure counters are shared by them (and are per process in
    :class:`FakeLLMProcess` mode).
    """

    def __init__(
        self,
        rules: Iterable[Rule] = (),
        *,
        default_reply: Reply = DEFAULT_REPLY,
        model: str = DEFAULT_MODEL,
        strict_model: bool = False,
        latency_s: float | Callable[[FakeRequest], float] = 0.0,
        token_latency_s: float = 0.0,
        failures: Iterable[Failure] = (),
        eos_token: bool = False,
        record: bool = True,
        token_ids: bool = True,
    ) -> None:
        self._setup(
            FakeLLMConfig(
                rules=tuple(rules),
                default_reply=default_reply,
                model=model,
                strict_model=strict_model,
                latency_s=latency_s,
                token_latency_s=token_latency_s,
                failures=tuple(failures),
                eos_token=eos_token,
                record=record,
                token_ids=token_ids,
            )
        )
        self.tokenizer = FakeTokenizer()
        """The tokenizer every token id and logprob comes from."""
        self.requests = RequestLog()
        """Every request received (except ``/health`` and ``/_fake/*``)."""

    def _setup(self, config: FakeLLMConfig) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._rules = [(rule, _compile_match(rule.match)) for rule in config.rules]
        self._script_pos = [0] * len(config.rules)
        self._set_failures(config.failures)

    def _set_failures(self, failures: Sequence[Failure]) -> None:
        self._failures = [(f, _compile_match(f.match)) for f in failures]
        self._failure_left = [f.times for f in failures]
        self._failure_rng = [random.Random(f.seed) for f in failures]

    # -- public API ---------------------------------------------------------------------------

    @property
    def model(self) -> str:
        """The served model name."""
        return self.config.model

    @classmethod
    def from_config(cls, config: FakeLLMConfig | Mapping[str, Any]) -> FakeLLM:
        """A backend from a :class:`FakeLLMConfig` or its JSON form (as in ``--config`` files)."""
        cfg = config if isinstance(config, FakeLLMConfig) else FakeLLMConfig.model_validate(config)
        return cls(**{name: getattr(cfg, name) for name in FakeLLMConfig.model_fields})

    def to_config(self) -> dict[str, Any]:
        """The JSON form of the configuration (for :class:`FakeLLMProcess`).

        Raises:
            UserError: the configuration holds callables, which cannot cross processes.
        """
        try:
            return self.config.model_dump(mode="json")
        except PydanticSerializationError as exc:
            raise UserError(
                "this FakeLLM uses callables (a match, reply or latency function), which cannot be sent "
                "to another process; use regexes and fixed replies, or run it in-process with FakeLLMServer"
            ) from exc

    def set_failures(self, failures: Iterable[Failure]) -> None:
        """Replace the injected failures (their counters and random draws start afresh)."""
        failures = tuple(failures)
        with self._lock:
            self.config = self.config.model_copy(update={"failures": failures})
            self._set_failures(failures)

    def reset(self) -> None:
        """Rewind scripts and failure counters and clear the request log."""
        with self._lock:
            self._script_pos = [0] * len(self._rules)
            self._set_failures(self.config.failures)
        self.requests.clear()

    # -- request handling (used by the ASGI app) ------------------------------------------------

    def parse(
        self, kind: Literal["chat", "completion"], body: Any, headers: dict[str, str]
    ) -> tuple[FakeRequest, Params]:
        """Validate a request body; raises :class:`HTTPError` (400/404) when it is unusable."""
        if not isinstance(body, dict):
            raise HTTPError(400, "the request body must be a JSON object")
        model = body.get("model") or self.config.model
        if not isinstance(model, str):
            raise HTTPError(400, "model must be a string", param="model")
        if self.config.strict_model and model != self.config.model:
            raise HTTPError(
                404, f"The model `{model}` does not exist.", type="invalid_request_error", code="model_not_found"
            )
        n = _int_param(body, "n", 1, low=1, high=128)
        max_tokens = body.get("max_completion_tokens")
        if max_tokens is None:
            max_tokens = body.get("max_tokens")
        if max_tokens is not None:
            max_tokens = _int_param(body, "max_tokens", None, low=1, value=max_tokens)
        stop = body.get("stop")
        if stop is None:
            stop = []
        elif isinstance(stop, str):
            stop = [stop]
        elif not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
            raise HTTPError(400, "stop must be a string or a list of strings", param="stop")
        stream = bool(body.get("stream"))
        include_usage = stream and bool((body.get("stream_options") or {}).get("include_usage"))
        if kind == "chat":
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
                raise HTTPError(400, "messages must be a non-empty list of objects", param="messages")
            tools = body.get("tools") or None
            if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
                raise HTTPError(400, "tools must be a list of objects", param="tools")
            try:
                prompt_ids = self.tokenizer.render_chat(messages, tools)
            except (KeyError, TypeError, AttributeError) as exc:
                raise HTTPError(400, f"malformed messages: {exc!r}", param="messages") from exc
            logprobs = bool(body.get("logprobs"))
            top = _int_param(body, "top_logprobs", 0, low=0, high=20) if logprobs else 0
            text = content_text(messages[-1].get("content"))
            request = FakeRequest(kind, body, headers, model, text, prompt_ids, messages=messages, tools=tools)
            prompts = [(prompt_ids, "")]
        else:
            if body.get("echo"):
                raise HTTPError(400, "echo is not supported by the fake LLM", param="echo")
            prompts = self._completion_prompts(body.get("prompt"))
            lp = body.get("logprobs")
            logprobs = lp is not None and lp is not False
            top = _int_param(body, "logprobs", 0, low=0, high=20, value=1 if lp is True else lp) if logprobs else 0
            ids, text = prompts[0]
            request = FakeRequest(kind, body, headers, model, text, ids, prompt=text)
        params = Params(
            kind=kind,
            model=model,
            n=n,
            max_tokens=max_tokens,
            stop=stop,
            stream=stream,
            include_usage=include_usage,
            return_token_ids=bool(body.get("return_token_ids")) and self.config.token_ids,
            logprobs=logprobs,
            top_logprobs=top,
            tokens_as_ids=bool(body.get("return_tokens_as_token_ids")),
            prompts=prompts,
        )
        return request, params

    def _completion_prompts(self, prompt: Any) -> list[tuple[list[int], str]]:
        tok = self.tokenizer
        if isinstance(prompt, str):
            return [(tok.encode(prompt), prompt)]
        if isinstance(prompt, list) and prompt:
            if all(isinstance(p, str) for p in prompt):
                return [(tok.encode(p), p) for p in prompt]
            try:
                if all(isinstance(p, int) for p in prompt):
                    return [(list(prompt), tok.decode(prompt))]
                if all(isinstance(p, list) and p and all(isinstance(i, int) for i in p) for p in prompt):
                    return [(list(p), tok.decode(p)) for p in prompt]
            except ValueError as exc:
                raise HTTPError(400, str(exc), param="prompt") from exc
        raise HTTPError(400, "prompt must be a string, a list of strings, or token ids", param="prompt")

    def latency_for(self, request: FakeRequest) -> float:
        """Seconds to wait before answering ``request``."""
        latency = self.config.latency_s
        return float(latency(request)) if callable(latency) else latency

    def failure_for(self, request: FakeRequest) -> Failure | None:
        """The injected failure that triggers on ``request``, if any (counts it)."""
        if not self._failures:
            return None
        with self._lock:
            for i, (failure, matches) in enumerate(self._failures):
                if not matches(request):
                    continue
                left = self._failure_left[i]
                if left == 0:
                    continue
                if failure.probability is not None and self._failure_rng[i].random() >= failure.probability:
                    continue
                if left is not None:
                    self._failure_left[i] = left - 1
                return failure
        return None

    def reply_for(self, request: FakeRequest) -> str | ToolCalls:
        """The reply of the first matching rule (or the default reply) for ``request``."""
        for i, (rule, matches) in enumerate(self._rules):
            if not matches(request):
                continue
            reply = rule.reply
            if isinstance(reply, list):
                with self._lock:
                    pos = self._script_pos[i]
                    if pos >= len(reply):
                        continue
                    self._script_pos[i] = pos + 1
                reply = reply[pos]
            return _normalize(reply, request)
        return _normalize(self.config.default_reply, request)

    def generate(self, request: FakeRequest, params: Params) -> list[Choice]:
        """Every choice of the response (``n`` per prompt)."""
        choices: list[Choice] = []
        for p, (ids, text) in enumerate(params.prompts):
            if p:
                request = FakeRequest(
                    request.kind, request.body, request.headers, request.model, text, ids, prompt=text
                )
            for j in range(params.n):
                each = request if j == 0 else dataclasses.replace(request, choice=j)
                choices.append(self._choice(len(choices), p, self.reply_for(each), params))
        return choices

    def _choice(self, index: int, prompt_index: int, reply: str | ToolCalls, params: Params) -> Choice:
        tok = self.tokenizer
        chat = params.kind == "chat"
        if isinstance(reply, ToolCalls):
            content = reply.content or ""
            calls = [(c.id or unique_id("call_"), c.name, c.arguments_json()) for c in reply.tool_calls]
            segments = [
                tok.tool_call_segments(name, args, first=k == 0 and not content)
                for k, (_, name, args) in enumerate(calls)
            ]
            content_ids = list(_encode(content))
            all_ids = content_ids + [t for seg in segments for part in seg for t in _encode(part)]
            if chat and (params.max_tokens is None or len(all_ids) <= params.max_tokens):
                pieces: list[tuple[Any, list[int]]] = [({"content": tok.token_text(t)}, [t]) for t in content_ids]
                tool_calls = []
                for k, ((call_id, name, args), (head, arg_text, call_tail)) in enumerate(
                    zip(calls, segments, strict=True)
                ):
                    tool_calls.append(
                        {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
                    )
                    head_delta = {
                        "index": k,
                        "id": call_id,
                        "type": "function",
                        "function": {"name": name, "arguments": ""},
                    }
                    pieces.append(({"tool_calls": [head_delta]}, list(_encode(head))))
                    for t in _encode(arg_text):
                        pieces.append(
                            ({"tool_calls": [{"index": k, "function": {"arguments": tok.token_text(t)}}]}, [t])
                        )
                    pieces[-1][1].extend(_encode(call_tail))
                return Choice(index, prompt_index, content or "", tool_calls, pieces, all_ids, [], "tool_calls")
            # Completions (or a truncated call): the rendering is plain text.
            reply = tok.decode(all_ids)
        text = reply
        stopped = False
        if params.stop:
            cut = min((i for i in (text.find(s) for s in params.stop if s) if i >= 0), default=-1)
            if cut >= 0:
                text, stopped = text[:cut], True
        ids = list(_encode(text))
        tail: list[int] = []
        finish = "stop"
        limit = params.max_tokens
        if limit is not None and len(ids) > limit:
            ids = ids[:limit]
            text = tok.decode(ids)
            finish = "length"
        elif self.config.eos_token and not stopped:
            if limit is not None and len(ids) >= limit:
                finish = "length"
            else:
                tail = [IM_END]
        if chat:
            pieces = [({"content": tok.token_text(t)}, [t]) for t in ids]
        else:
            pieces = [(tok.token_text(t), [t]) for t in ids]
        return Choice(index, prompt_index, text, None, pieces, ids + tail, tail, finish)


def _normalize(reply: Any, request: FakeRequest) -> str | ToolCalls:
    if callable(reply):
        reply = reply(request)
    if isinstance(reply, str | ToolCalls):
        return reply
    if isinstance(reply, ToolCall):
        return ToolCalls([reply])
    if isinstance(reply, list | tuple) and reply and all(isinstance(c, ToolCall) for c in reply):
        return ToolCalls(reply)
    raise TypeError(f"a fake LLM reply must be a str, ToolCall, ToolCalls or list of ToolCall, got {reply!r}")


def _int_param(
    body: Mapping[str, Any], name: str, default: int | None, *, low: int, high: int | None = None, value: Any = None
) -> Any:
    if value is None:
        value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        bounds = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise HTTPError(400, f"{name} must be an integer {bounds}, got {value!r}", param=name)
    return value
