"""A traced LLM call as the OpenAI request and response it was: what retokenization reads.

An instrumentation records a call's messages in its own shape. After the adapters' translation
(:mod:`.translation`) the span carries ``gen_ai.input.messages`` / ``gen_ai.output.messages`` in
either OpenAI chat form (``content``, ``tool_calls``: OpenInference through its adapter) or the
OpenTelemetry GenAI form (``parts``: OpenLLMetry 0.50+); tool definitions come as OpenInference's
``llm.tools.{i}.tool.json_schema`` or GenAI's ``gen_ai.tool.definitions``; AgentOps and older
OpenLLMetry flatten them into ``gen_ai.prompt.{i}.*`` / ``gen_ai.completion.{i}.*`` and
``llm.request.functions.{i}.*``. :func:`call_exchange`
rebuilds the Chat Completions ``(request, response)`` pair from either, with the usage the
provider reported, so :class:`~agentbolt.capture.retokenize.ChatTemplateRetokenizer` and its
drift check run on it exactly as the gateway runs them on a live call.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from .. import semconv
from .. import types as t
from ..json_text import json_str
from ..lightningrl import spans as sp

__all__ = ["call_exchange", "flat_messages", "openai_message", "tool_definitions"]

_OI_TOOL = re.compile(r"^llm\.tools\.(\d+)\.tool\.json_schema$")
_FLAT = re.compile(r"^gen_ai\.(prompt|completion)\.(\d+)\.(.+)$")
_FLAT_CALL = re.compile(r"^tool_calls\.(\d+)\.(id|name|arguments)$")
_FLAT_FUNCTIONS = re.compile(r"^llm\.request\.functions\.(\d+)\.(name|description|parameters)$")
_GENAI_TOOLS = "gen_ai.tool.definitions"
_FINISH = {"tool_call": "tool_calls", "tool_calls": "tool_calls", "stop": "stop", "length": "length"}


def _arguments(value: Any) -> str:
    """Tool-call arguments as the JSON text a provider sends (compact, as OpenAI-style APIs emit)."""
    if isinstance(value, str):
        return value
    return json_str(value)  # an integer beyond 64 bits too


def _tool_call(part: Mapping[str, Any]) -> dict[str, Any]:
    fn = part.get("function") if isinstance(part.get("function"), Mapping) else None
    if fn is not None:  # already OpenAI-shaped
        return {
            "id": part.get("id"),
            "type": "function",
            "function": {"name": fn.get("name"), "arguments": _arguments(fn.get("arguments") or "")},
        }
    return {
        "id": part.get("id"),
        "type": "function",
        "function": {"name": part.get("name"), "arguments": _arguments(part.get("arguments") or {})},
    }


def openai_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """One message in OpenAI chat form, from OpenAI or GenAI (``parts``) form. ``finish_reason``
    (an output message's) is kept."""
    role = str(message.get("role") or "assistant")
    out: dict[str, Any] = {"role": role}
    if "parts" not in message:
        for key in ("content", "tool_call_id", "name"):
            if message.get(key) is not None:
                out[key] = message[key]
        calls = message.get("tool_calls")
        if isinstance(calls, list) and calls:
            out["tool_calls"] = [_tool_call(c) for c in calls if isinstance(c, Mapping)]
    else:
        texts: list[str] = []
        calls_out: list[dict[str, Any]] = []
        for part in message.get("parts") or ():
            if not isinstance(part, Mapping):
                continue
            kind = part.get("type")
            if kind == "text" and part.get("content") is not None:
                texts.append(str(part["content"]))
            elif kind == "tool_call":
                calls_out.append(_tool_call(part))
            elif kind == "tool_call_response":
                out["role"] = "tool"
                out["tool_call_id"] = part.get("id")
                response = part.get("response", part.get("result"))
                texts.append(response if isinstance(response, str) else _arguments(response))
        if texts:
            out["content"] = "".join(texts)
        if calls_out:
            out["tool_calls"] = calls_out
    if message.get("finish_reason") is not None:
        out["finish_reason"] = message["finish_reason"]
    return out


def tool_definitions(span: t.Span) -> list[dict[str, Any]]:
    """The tools the call offered, as OpenAI ``tools`` entries (``[]`` when none were recorded)."""
    attrs = span.attributes
    found: dict[int, dict[str, Any]] = {}
    for key, value in attrs.items():
        match = _OI_TOOL.match(key)
        if match is not None and isinstance(value, str):
            try:
                found[int(match.group(1))] = dict(orjson.loads(value))
            except (orjson.JSONDecodeError, TypeError, ValueError):
                continue
    if found:
        return [found[i] for i in sorted(found)]
    flat: dict[int, dict[str, Any]] = {}
    for key, value in attrs.items():  # OpenLLMetry before gen_ai.tool.definitions, AgentOps
        if (match := _FLAT_FUNCTIONS.match(key)) is not None:
            if match.group(2) == "parameters" and isinstance(value, str):
                try:
                    value = orjson.loads(value)
                except orjson.JSONDecodeError:
                    pass
            flat.setdefault(int(match.group(1)), {})[match.group(2)] = value
    if flat:
        return [{"type": "function", "function": flat[i]} for i in sorted(flat)]
    raw = attrs.get(_GENAI_TOOLS)
    if not isinstance(raw, str):
        return []
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return []
    tools = []
    for item in value if isinstance(value, list) else ():
        if not isinstance(item, Mapping):
            continue
        if isinstance(item.get("function"), Mapping):
            tools.append(dict(item))
        else:  # GenAI's flat form: {"type": "function", "name": ..., "description": ..., "parameters": ...}
            fn = {k: item[k] for k in ("name", "description", "parameters") if k in item}
            tools.append({"type": "function", "function": fn})
    return tools


def flat_messages(attrs: Mapping[str, Any], which: str) -> list[dict[str, Any]]:
    """Messages flattened into ``gen_ai.prompt.{i}.*`` (``which="prompt"``) or
    ``gen_ai.completion.{i}.*`` (``"completion"``) attributes, as AgentOps and OpenLLMetry before
    the GenAI message attributes record them: ``role``, ``content``, ``finish_reason``,
    ``tool_call_id``, ``tool_calls.{j}.{id,name,arguments}``."""
    messages: dict[int, dict[str, Any]] = {}
    calls: dict[int, dict[int, dict[str, Any]]] = {}
    for key, value in attrs.items():
        match = _FLAT.match(key)
        if match is None or match.group(1) != which:
            continue
        index, field = int(match.group(2)), match.group(3)
        message = messages.setdefault(index, {})
        if field in ("role", "content", "finish_reason", "tool_call_id"):
            message[field] = value
        elif (call := _FLAT_CALL.match(field)) is not None:
            calls.setdefault(index, {}).setdefault(int(call.group(1)), {})[call.group(2)] = value
    out = []
    for index in sorted(messages):
        message = messages[index]
        if index in calls:
            message["tool_calls"] = [_tool_call(c) for _, c in sorted(calls[index].items())]
        out.append(message)
    return out


def call_exchange(span: t.Span) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The Chat Completions ``(request, response)`` of a traced LLM span, or ``None`` when the
    span recorded no input messages or no output (nothing to retokenize)."""
    inputs = [openai_message(m) for m in sp.input_messages(span) or flat_messages(span.attributes, "prompt")]
    outputs = [openai_message(m) for m in sp.output_messages(span) or flat_messages(span.attributes, "completion")]
    if not inputs or not outputs:
        return None
    request: dict[str, Any] = {"messages": [{k: v for k, v in m.items() if k != "finish_reason"} for m in inputs]}
    tools = tool_definitions(span)
    if tools:
        request["tools"] = tools
    model = span.attributes.get(semconv.GEN_AI_REQUEST_MODEL)
    if isinstance(model, str):
        request["model"] = model
    first = outputs[0]
    message = {k: v for k, v in first.items() if k != "finish_reason"}
    message["role"] = "assistant"
    finish = first.get("finish_reason") or _finish_reason(span)
    if finish is None:
        finish = "tool_calls" if message.get("tool_calls") else "stop"
    response: dict[str, Any] = {
        "choices": [{"index": 0, "message": message, "finish_reason": _FINISH.get(str(finish), str(finish))}]
    }
    usage = {}
    for key, attr in (
        ("prompt_tokens", semconv.GEN_AI_USAGE_INPUT_TOKENS),
        ("completion_tokens", semconv.GEN_AI_USAGE_OUTPUT_TOKENS),
    ):
        value = sp.genai_attribute(span, attr)
        if isinstance(value, int) and not isinstance(value, bool):
            usage[key] = value
    if usage:
        response["usage"] = usage
    return request, response


def _finish_reason(span: t.Span) -> str | None:
    reasons: Any = span.attributes.get(semconv.GEN_AI_RESPONSE_FINISH_REASONS)
    if isinstance(reasons, Sequence) and not isinstance(reasons, str) and reasons:
        return str(reasons[0])
    if isinstance(reasons, str) and reasons:
        return reasons
    value = span.attributes.get("llm.finish_reason")  # OpenInference
    return value if isinstance(value, str) and value else None
