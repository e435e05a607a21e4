"""Field conversions every adapter needs: framework timestamps, tool calls, token usage, an
OpenAI chat completion's response attributes and bounded text, as :mod:`agentbolt.semconv`
attributes."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from ... import semconv

__all__ = [
    "call_arguments",
    "chat_completion_attributes",
    "request_attributes",
    "text_attribute",
    "tool_call",
    "unix_ns",
    "usage_attributes",
]


def unix_ns(value: Any) -> int:
    """Unix nanoseconds of a framework's timestamp: a ``datetime``, an ISO-8601 string or Unix
    seconds; 0 when unknown (:class:`SpanRecorder` then uses now)."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return 0
    if isinstance(value, datetime):
        return int(value.timestamp() * 1_000_000) * 1000
    if isinstance(value, int | float) and not isinstance(value, bool):
        return int(value * 1e9)
    return 0


def tool_call(call_id: Any, name: Any, arguments: Any) -> dict[str, Any]:
    """A tool call as ``gen_ai.output.messages`` hold it (an OpenAI chat ``tool_calls`` entry)."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def call_arguments(value: Any) -> Any:
    """A tool's arguments from how instrumentations record a decorated call, a JSON
    ``{"args": [...], "kwargs": {...}}`` (AgentOps, OpenLLMetry, smolagents' OpenInference
    spans): the keyword arguments as JSON when there are no positional ones, else ``value`` as it is."""
    if isinstance(value, str) and value.startswith("{"):
        try:
            call = json.loads(value)
        except ValueError:
            return value
        if isinstance(call, Mapping) and not call.get("args") and isinstance(call.get("kwargs"), Mapping):
            return json.dumps(call["kwargs"], ensure_ascii=False)
    return value


def text_attribute(value: Any, limit: int) -> str | None:
    """``value`` as a span attribute of at most ``limit`` characters (and a final ``…`` when
    cut): a string as it is, anything else as JSON; ``None`` stays ``None``."""
    if value is None:
        return None
    text = value if isinstance(value, str) else json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= limit else text[:limit] + "…"


def usage_attributes(usage: Any) -> dict[str, Any]:
    """``gen_ai.usage.*`` of a token usage record, a mapping or an object, in either OpenAI
    spelling (``input_tokens``/``output_tokens``, or ``prompt_tokens``/``completion_tokens``);
    empty when there is none."""
    if usage is None:
        return {}
    return {
        semconv.GEN_AI_USAGE_INPUT_TOKENS: _number(usage, "input_tokens", "prompt_tokens", kind=int),
        semconv.GEN_AI_USAGE_OUTPUT_TOKENS: _number(usage, "output_tokens", "completion_tokens", kind=int),
    }


def request_attributes(params: Any) -> dict[str, Any]:
    """``gen_ai.request.*`` sampling parameters of an OpenAI-style request's parameters, a
    mapping or an object (``temperature``, ``top_p``, ``max_tokens`` or
    ``max_completion_tokens``); empty when there are none."""
    if params is None:
        return {}
    return {
        semconv.GEN_AI_REQUEST_TEMPERATURE: _number(params, "temperature"),
        semconv.GEN_AI_REQUEST_TOP_P: _number(params, "top_p"),
        semconv.GEN_AI_REQUEST_MAX_TOKENS: _number(params, "max_tokens", "max_completion_tokens", kind=int),
    }


def chat_completion_attributes(response: Any, *, content: bool = False) -> dict[str, Any]:
    """Response attributes of an OpenAI Chat Completions response or stream chunk (the SDK's
    object or its dict dump; another provider's response with ``id``/``model`` works too): id,
    model, finish reasons and usage; with ``content``, also ``gen_ai.output.messages`` (the
    choices' messages, empty fields left out)."""
    attrs: dict[str, Any] = {}
    for name, key in (("id", semconv.GEN_AI_RESPONSE_ID), ("model", semconv.GEN_AI_RESPONSE_MODEL)):
        value = _field(response, name)
        if isinstance(value, str) and value:
            attrs[key] = value
    choices = _field(response, "choices")
    if isinstance(choices, list | tuple):
        reasons = [str(reason) for c in choices if (reason := _field(c, "finish_reason"))]
        if reasons:
            attrs[semconv.GEN_AI_RESPONSE_FINISH_REASONS] = reasons
        messages = [_message(m) for c in choices if (m := _field(c, "message"))] if content else []
        if messages:
            attrs[semconv.GEN_AI_OUTPUT_MESSAGES] = messages
    attrs.update(usage_attributes(_field(response, "usage")))
    return attrs


def _field(record: Any, name: str) -> Any:
    return record.get(name) if isinstance(record, Mapping) else getattr(record, name, None)


def _number(record: Any, *names: str, kind: type | tuple[type, ...] = (int, float)) -> Any:
    """The first of the fields ``names`` that holds a number of ``kind`` (not a bool), or ``None``."""
    for name in names:
        value = _field(record, name)
        if isinstance(value, kind) and not isinstance(value, bool):
            return value
    return None


def _message(message: Any) -> Any:
    if hasattr(message, "model_dump"):
        message = message.model_dump(exclude_none=True)
    if not isinstance(message, Mapping):
        return message
    return {k: v for k, v in message.items() if v is not None and v != []}
