"""Turn one OpenAI-compatible call (request + response, or a stream) into one LLM-call span.

Token ids and logprobs come from vLLM-style fields the gateway asks upstreams for
(``return_token_ids``, ``logprobs``):

- chat: top-level ``prompt_token_ids``, ``choices[i].token_ids``, ``choices[i].logprobs.content``;
- completions: ``choices[i].prompt_token_ids``, ``choices[i].token_ids``,
  ``choices[i].logprobs.token_logprobs``;
- streams: the same fields spread over chunks (``prompt_token_ids`` in the first chunk, delta
  ``token_ids`` in each).

When an upstream returns no ids the span says ``token_source = "missing"`` (or
``"retokenized"`` when a retokenizer is configured): LightningRL reports such calls instead of
training on them silently.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from .. import semconv
from .. import types as t
from ..capture.retokenize import drift_reasons
from ..request_fingerprint import fingerprints
from .translate import SSEDecoder

__all__ = ["CallRecord", "Retokenizer", "StreamAssembler", "build_span", "parse_traceparent"]

Retokenizer = Callable[[Mapping[str, Any], Mapping[str, Any]], tuple[list[int], list[int]] | None]
"""``(request, response) -> (prompt_ids, response_ids)`` for upstreams that return no ids."""

_UNSET = t.SpanStatus()
"""The status of a call that did not fail (immutable: one instance serves every span)."""

# Request fields kept in ``agentbolt.llm.request`` (messages/prompt go to gen_ai.input.messages).
_BULKY_REQUEST_FIELDS = ("messages", "prompt")


@dataclass(slots=True)
class CallRecord:
    """Everything the gateway knows about one call when it ends."""

    rollout_id: str
    attempt_id: str
    operation: str
    """``chat`` or ``text_completion``."""
    request: dict[str, Any]
    """The request as forwarded upstream."""
    upstream: str
    start_ns: int
    end_ns: int = 0
    response: dict[str, Any] | None = None
    """The (assembled) response body, when the upstream answered 2xx."""
    status: int = 0
    """HTTP status returned to the client."""
    error_type: str | None = None
    error_message: str | None = None
    stream: bool = False
    policy_version: int | None = None
    trace_id: str | None = None
    parent_span_id: str | None = None
    upstream_latency_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _finish_reasons(choices: list[dict[str, Any]]) -> list[str]:
    return [str(c.get("finish_reason")) for c in choices if c.get("finish_reason") is not None]


def _choice_logprobs(choice: Mapping[str, Any], operation: str) -> list[float] | None:
    lp = choice.get("logprobs")
    if not lp:
        return None
    if operation == semconv.OP_CHAT:
        content = lp.get("content")
        if content is None:
            return None
        return [float(x.get("logprob", 0.0)) for x in content]
    values = lp.get("token_logprobs")
    return None if values is None else [float(x) if x is not None else 0.0 for x in values]


def _output_messages(response: Mapping[str, Any], operation: str) -> list[dict[str, Any]]:
    out = []
    for choice in response.get("choices") or ():
        if operation == semconv.OP_CHAT:
            message = dict(choice.get("message") or {})
            message.setdefault("role", "assistant")
        else:
            message = {"role": "assistant", "content": choice.get("text", "")}
        out.append({**message, "finish_reason": choice.get("finish_reason")})
    return out


def _slim_response(response: Mapping[str, Any]) -> dict[str, Any]:
    """The response without token ids and logprob tables (they have their own attributes)."""
    slim = {k: v for k, v in response.items() if k != "prompt_token_ids"}
    choices = []
    for choice in response.get("choices") or ():
        choices.append({k: v for k, v in choice.items() if k not in ("token_ids", "prompt_token_ids", "logprobs")})
    slim["choices"] = choices
    return slim


def build_span(record: CallRecord, *, span_id: str | None = None, retokenize: Retokenizer | None = None) -> t.Span:
    """The LLM-call span for a finished call (successful or not)."""
    req = record.request
    model = str(req.get("model", ""))
    attrs: dict[str, Any] = {
        semconv.SPAN_KIND_ATTR: semconv.KIND_LLM,
        semconv.GEN_AI_OPERATION_NAME: record.operation,
        semconv.GEN_AI_SYSTEM: "openai",
        semconv.GEN_AI_REQUEST_MODEL: model,
        semconv.LLM_STREAM: record.stream,
        semconv.LLM_UPSTREAM: record.upstream,
        semconv.LLM_LATENCY_S: (record.end_ns - record.start_ns) / 1e9,
        semconv.LLM_REQUEST: orjson.dumps({k: v for k, v in req.items() if k not in _BULKY_REQUEST_FIELDS}).decode(),
    }
    for key, attr in (
        ("temperature", semconv.GEN_AI_REQUEST_TEMPERATURE),
        ("top_p", semconv.GEN_AI_REQUEST_TOP_P),
        ("max_tokens", semconv.GEN_AI_REQUEST_MAX_TOKENS),
    ):
        if isinstance(req.get(key), int | float) and not isinstance(req.get(key), bool):
            attrs[attr] = req[key]
    if isinstance(req.get("top_k"), int) and not isinstance(req.get("top_k"), bool):
        attrs[semconv.GEN_AI_REQUEST_TOP_K] = req["top_k"]  # an int since the GenAI conventions' own repository
    if "messages" in req:
        attrs[semconv.GEN_AI_INPUT_MESSAGES] = orjson.dumps(req["messages"]).decode()
        if (prints := fingerprints(req["messages"])) is not None:
            attrs[semconv.LLM_REQUEST_FINGERPRINT] = prints
    elif "prompt" in req:
        attrs[semconv.GEN_AI_INPUT_MESSAGES] = orjson.dumps([{"role": "user", "content": req["prompt"]}]).decode()
    if record.policy_version is not None:
        attrs[semconv.POLICY_VERSION] = record.policy_version
    if record.upstream_latency_s is not None:
        attrs["agentbolt.llm.upstream_latency_s"] = record.upstream_latency_s

    status = _UNSET
    resp = record.response
    if resp is not None and record.error_type is None:
        choices = resp.get("choices") or []
        if resp.get("id"):
            attrs[semconv.GEN_AI_RESPONSE_ID] = str(resp["id"])
        if resp.get("model"):
            attrs[semconv.GEN_AI_RESPONSE_MODEL] = str(resp["model"])
        attrs[semconv.GEN_AI_RESPONSE_FINISH_REASONS] = _finish_reasons(choices)
        usage = resp.get("usage") or {}
        if isinstance(usage.get("prompt_tokens"), int):
            attrs[semconv.GEN_AI_USAGE_INPUT_TOKENS] = usage["prompt_tokens"]
        if isinstance(usage.get("completion_tokens"), int):
            attrs[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] = usage["completion_tokens"]
        attrs[semconv.GEN_AI_OUTPUT_MESSAGES] = orjson.dumps(_output_messages(resp, record.operation)).decode()
        attrs[semconv.LLM_RESPONSE] = orjson.dumps(_slim_response(resp)).decode()
        first = choices[0] if choices else {}
        prompt_ids = resp.get("prompt_token_ids") or first.get("prompt_token_ids")
        response_ids = first.get("token_ids")
        source = semconv.TOKEN_SOURCE_MISSING
        tokens: tuple[list[int], list[int]] | None = None  # (prompt ids, response ids)
        if isinstance(prompt_ids, list) and isinstance(response_ids, list):
            source, tokens = semconv.TOKEN_SOURCE_EXACT, (prompt_ids, response_ids)
        elif retokenize is not None:
            ids = retokenize(req, resp)
            if ids is not None:
                source, tokens = semconv.TOKEN_SOURCE_RETOKENIZED, (list(ids[0]), list(ids[1]))
                drift = drift_reasons(resp, tokens[0], tokens[1], getattr(retokenize, "decode", None))
                if drift:
                    attrs[semconv.TOKEN_DRIFT] = "; ".join(drift)
        attrs[semconv.TOKEN_SOURCE] = source
        if tokens is not None:
            attrs[semconv.PROMPT_TOKEN_IDS] = list(tokens[0])
            attrs[semconv.RESPONSE_TOKEN_IDS] = list(tokens[1])
            n_response = len(tokens[1])
            logprobs = _choice_logprobs(first, record.operation)
            if logprobs is not None and not all(map(math.isfinite, logprobs)):
                attrs["agentbolt.llm.logprobs_invalid"] = "the upstream returned non-finite logprobs; they are not kept"
                logprobs = None
            if logprobs is not None and len(logprobs) == n_response:
                attrs[semconv.RESPONSE_LOGPROBS] = logprobs
            elif logprobs is not None:
                attrs["agentbolt.llm.logprobs_mismatch"] = f"{len(logprobs)} logprobs for {n_response} tokens"
        if len(choices) > 1:  # n > 1: every choice's ids, for algorithms that want them
            attrs["agentbolt.llm.choices"] = orjson.dumps(
                [{"token_ids": c.get("token_ids"), "logprobs": _choice_logprobs(c, record.operation)} for c in choices]
            ).decode()
    else:
        status = t.SpanStatus(code=t.StatusCode.ERROR, message=record.error_message or "upstream error")
        attrs[semconv.ERROR_TYPE] = record.error_type or "error"
        attrs[semconv.TOKEN_SOURCE] = semconv.TOKEN_SOURCE_MISSING
        attrs["http.response.status_code"] = record.status
    attrs.update(record.extra)
    # Every attribute above is a str, bool, int, float or a list of one of them (JSON numbers
    # decode as int/float; logprobs are cast to float), so the span is built without
    # re-validating thousands of token ids on the gateway's hot path.
    return t.Span.model_construct(
        rollout_id=record.rollout_id,
        attempt_id=record.attempt_id,
        trace_id=record.trace_id or os.urandom(16).hex(),
        span_id=span_id or os.urandom(8).hex(),
        parent_span_id=record.parent_span_id,
        name=semconv.SPAN_LLM_CALL,
        kind=t.SpanKind.CLIENT,
        start_time_ns=record.start_ns,
        end_time_ns=record.end_ns or time.time_ns(),
        status=status,
        attributes=attrs,
        events=[],
        links=[],
        resource={},
        scope="agentbolt.gateway",
        schema_version=semconv.SCHEMA_VERSION,
        seq=None,
    )


class StreamAssembler:
    """Rebuilds a non-streaming response body from the SSE chunks that pass through."""

    def __init__(self, operation: str) -> None:
        self.operation = operation
        self._sse = SSEDecoder()
        self.id: str | None = None
        self.model: str | None = None
        self.created: int | None = None
        self.prompt_token_ids: list[int] | None = None
        self.usage: dict[str, Any] | None = None
        self.choices: dict[int, dict[str, Any]] = {}
        self.error: dict[str, Any] | None = None

    def feed(self, data: bytes) -> None:
        """Consume raw bytes of the event stream (any split)."""
        for chunk in self._sse.feed(data):
            self._chunk(chunk)

    @property
    def done(self) -> bool:
        """True once the stream's ``data: [DONE]`` arrived."""
        return self._sse.done

    def _chunk(self, chunk: dict[str, Any]) -> None:
        if "error" in chunk:
            self.error = chunk["error"] if isinstance(chunk["error"], dict) else {"message": str(chunk["error"])}
            return
        self.id = self.id or chunk.get("id")
        self.model = self.model or chunk.get("model")
        self.created = self.created or chunk.get("created")
        if chunk.get("prompt_token_ids") is not None:
            self.prompt_token_ids = list(chunk["prompt_token_ids"])
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            acc = self.choices.setdefault(
                int(choice.get("index", 0)),
                {"text": [], "token_ids": [], "logprobs": [], "tool_calls": {}, "finish_reason": None, "role": None},
            )
            if choice.get("prompt_token_ids") is not None and self.prompt_token_ids is None:
                self.prompt_token_ids = list(choice["prompt_token_ids"])
            if choice.get("token_ids"):
                acc["token_ids"].extend(choice["token_ids"])
            if choice.get("finish_reason"):
                acc["finish_reason"] = choice["finish_reason"]
            lp = choice.get("logprobs")
            if lp:
                if self.operation == semconv.OP_CHAT:
                    acc["logprobs"].extend(lp.get("content") or ())
                else:
                    acc["logprobs"].extend(lp.get("token_logprobs") or ())
            if self.operation == semconv.OP_CHAT:
                delta = choice.get("delta") or {}
                if delta.get("role"):
                    acc["role"] = delta["role"]
                if delta.get("content"):
                    acc["text"].append(delta["content"])
                for tc in delta.get("tool_calls") or ():
                    slot = acc["tool_calls"].setdefault(
                        int(tc.get("index", 0)),
                        {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
                    )
                    if tc.get("id"):
                        slot["id"] = tc["id"]
                    fn = tc.get("function") or {}
                    if fn.get("name"):
                        slot["function"]["name"] += fn["name"]
                    if fn.get("arguments"):
                        slot["function"]["arguments"] += fn["arguments"]
            elif choice.get("text"):
                acc["text"].append(choice["text"])

    def response(self) -> dict[str, Any]:
        """The response as if the call had not streamed (vLLM field layout)."""
        choices = []
        for index in sorted(self.choices):
            acc = self.choices[index]
            text = "".join(acc["text"])
            choice: dict[str, Any] = {"index": index, "finish_reason": acc["finish_reason"]}
            if self.operation == semconv.OP_CHAT:
                message: dict[str, Any] = {"role": acc["role"] or "assistant", "content": text or None}
                if acc["tool_calls"]:
                    message["tool_calls"] = [acc["tool_calls"][k] for k in sorted(acc["tool_calls"])]
                choice["message"] = message
                if acc["logprobs"]:
                    choice["logprobs"] = {"content": acc["logprobs"]}
            else:
                choice["text"] = text
                if acc["logprobs"]:
                    choice["logprobs"] = {"token_logprobs": acc["logprobs"]}
            if acc["token_ids"]:
                choice["token_ids"] = acc["token_ids"]
            choices.append(choice)
        out: dict[str, Any] = {"id": self.id, "model": self.model, "created": self.created, "choices": choices}
        if self.prompt_token_ids is not None:
            out["prompt_token_ids"] = self.prompt_token_ids
        if self.usage is not None:
            out["usage"] = self.usage
        return out


def parse_traceparent(value: str | None) -> tuple[str | None, str | None]:
    """(trace id, parent span id) from a W3C ``traceparent`` header, if well formed."""
    if not value:
        return None, None
    parts = value.split("-")
    if len(parts) == 4 and len(parts[1]) == 32 and len(parts[2]) == 16:
        try:
            int(parts[1], 16), int(parts[2], 16)
        except ValueError:
            return None, None
        return parts[1].lower(), parts[2].lower()
    return None, None
