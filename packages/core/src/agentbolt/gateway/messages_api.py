"""The Anthropic Messages API (``POST /v1/messages``) as Chat Completions, and back.

Pure functions, no I/O, used by the gateway like :mod:`.responses_api`: an agent on the
``anthropic`` client (or LangChain's ``ChatAnthropic``) pointed at the gateway
(``base_url={gateway}/rollouts/{rid}/attempts/{aid}``, without ``/v1``: the client adds it) is
served by the policy and recorded with exact token ids.

Supported: ``system`` (string or text blocks), text / image / ``tool_use`` / ``tool_result``
content blocks (``thinking`` blocks are dropped), client tools (``name``, ``description``,
``input_schema``), ``tool_choice`` (``auto``, ``any``, ``tool``, ``none``,
``disable_parallel_tool_use``), ``max_tokens``, ``stop_sequences``, ``temperature``, ``top_p``,
``top_k``, streaming. Server tools (web search, code execution) and documents get HTTP 400.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from . import translate
from .translate import ChunkStream, Dialect, TranslationError, choice0, sse_event, stream_options, text_of

__all__ = ["DIALECT", "MessagesStream", "from_chat", "response_id", "to_chat"]

_API = "/v1/messages"
_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "function_call": "tool_use"}


def response_id(chat_id: str) -> str:
    """The Messages API id for an upstream Chat Completions id."""
    return f"msg_{chat_id}"


def _image(block: Mapping[str, Any]) -> dict[str, Any]:
    source = block.get("source") or {}
    if source.get("type") == "base64":
        url = f"data:{source.get('media_type', 'image/png')};base64,{source.get('data', '')}"
    elif source.get("type") == "url":
        url = str(source.get("url"))
    else:
        raise TranslationError(f"{_API}: image source type {source.get('type')!r} is not supported (base64 or url)")
    return {"type": "image_url", "image_url": {"url": url}}


def _user_turn(content: Any) -> list[dict[str, Any]]:
    """A user turn as Chat Completions messages: tool results first (as ``tool`` messages), then the rest."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for block in content or ():
        kind = block.get("type")
        if kind == "tool_result":
            result = block.get("content")
            text = text_of(result, allowed=("text",), api=_API) if not isinstance(result, str) else result
            if block.get("is_error"):
                text = f"Error: {text}"
            out.append({"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": text})
        elif kind == "text":
            parts.append({"type": "text", "text": str(block.get("text") or "")})
        elif kind == "image":
            parts.append(_image(block))
        else:
            raise TranslationError(
                f"{_API}: user content block type {kind!r} is not supported (text, image, tool_result)"
            )
    if parts:
        if all(p["type"] == "text" for p in parts):
            out.append({"role": "user", "content": "".join(p["text"] for p in parts)})
        else:
            out.append({"role": "user", "content": parts})
    return out


def _assistant_turn(content: Any) -> dict[str, Any]:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in content or ():
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text") or ""))
        elif kind == "tool_use":
            arguments = orjson.dumps(block.get("input") or {}).decode()
            calls.append(
                {
                    "id": block.get("id"),
                    "type": "function",
                    "function": {"name": block.get("name"), "arguments": arguments},
                }
            )
        elif kind in ("thinking", "redacted_thinking"):
            continue
        else:
            raise TranslationError(f"{_API}: assistant content block type {kind!r} is not supported (text, tool_use)")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
    if calls:
        message["tool_calls"] = calls
    return message


def _tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    if tool.get("type") not in (None, "custom"):
        raise TranslationError(
            f"{_API}: tool type {tool.get('type')!r} is a server tool the agentbolt gateway cannot run; "
            "only client tools (name, description, input_schema) are supported"
        )
    return translate.function_tool(tool, schema="input_schema")


def to_chat(body: Mapping[str, Any]) -> dict[str, Any]:
    """The Chat Completions request for a Messages API request."""
    messages: list[dict[str, Any]] = []
    if body.get("system"):
        messages.append({"role": "system", "content": text_of(body["system"], allowed=("text",), api=_API)})
    for message in body.get("messages") or ():
        role = message.get("role")
        if role == "user":
            messages.extend(_user_turn(message.get("content")))
        elif role == "assistant":
            messages.append(_assistant_turn(message.get("content")))
        else:
            raise TranslationError(f"{_API}: message role {role!r} is not supported (user, assistant)")
    if not messages:
        raise TranslationError(f"{_API}: messages must not be empty")
    chat: dict[str, Any] = {"model": body.get("model", ""), "messages": messages}
    if body.get("max_tokens") is not None:
        chat["max_tokens"] = body["max_tokens"]
    if body.get("stop_sequences"):
        chat["stop"] = list(body["stop_sequences"])
    for key in ("temperature", "top_p", "top_k"):
        if body.get(key) is not None:
            chat[key] = body[key]
    if body.get("tools"):
        chat["tools"] = [_tool(t) for t in body["tools"]]
    choice = body.get("tool_choice")
    if isinstance(choice, Mapping):
        kind = choice.get("type")
        if kind == "tool":
            chat["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
        elif kind in ("auto", "none"):
            chat["tool_choice"] = kind
        elif kind == "any":
            chat["tool_choice"] = "required"
        else:
            raise TranslationError(f"{_API}: tool_choice type {kind!r} is not supported")
        if choice.get("disable_parallel_tool_use"):
            chat["parallel_tool_calls"] = False
    if body.get("stream"):
        chat["stream"] = True
        stream_options(chat)
    return chat


def _input(arguments: str) -> dict[str, Any]:
    try:
        value = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _stop(finish_reason: str | None, body: Mapping[str, Any]) -> str | None:
    if finish_reason is None:
        return None
    return _STOP_REASONS.get(finish_reason, "end_turn")


def from_chat(chat: Mapping[str, Any], body: Mapping[str, Any]) -> dict[str, Any]:
    """The Messages API response for a Chat Completions response."""
    choice = choice0(chat)
    message = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    if message.get("content"):
        content.append({"type": "text", "text": str(message["content"])})
    for call in message.get("tool_calls") or ():
        fn = call.get("function") or {}
        content.append(
            {
                "type": "tool_use",
                "id": call.get("id"),
                "name": fn.get("name"),
                "input": _input(fn.get("arguments") or ""),
            }
        )
    usage = chat.get("usage") or {}
    return {
        "id": response_id(str(chat.get("id") or "")),
        "type": "message",
        "role": "assistant",
        "model": str(chat.get("model") or body.get("model") or ""),
        "content": content,
        "stop_reason": _stop(choice.get("finish_reason"), body),
        "stop_sequence": None,
        "usage": {
            "input_tokens": int(usage.get("prompt_tokens") or 0),
            "output_tokens": int(usage.get("completion_tokens") or 0),
        },
    }


class MessagesStream(ChunkStream):
    """Messages API streaming events for a Chat Completions chunk stream."""

    def __init__(self, body: Mapping[str, Any]) -> None:
        super().__init__(body)
        self._block: int = -1  # index of the open content block
        self._block_kind: str | None = None
        self._calls: dict[int, int] = {}  # chat tool-call index -> block index

    def _start(self, chunk: Mapping[str, Any]) -> bytes:
        prompt_ids = chunk.get("prompt_token_ids")
        message: dict[str, Any] = {
            "id": response_id(str(chunk.get("id") or "")),
            "type": "message",
            "role": "assistant",
            "model": str(chunk.get("model") or self.body.get("model") or ""),
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": len(prompt_ids) if isinstance(prompt_ids, list) else 0, "output_tokens": 0},
        }
        return sse_event("message_start", {"type": "message_start", "message": message})

    def _open(self, block: dict[str, Any], kind: str) -> bytes:
        out = self._close_block()
        self._block += 1
        self._block_kind = kind
        return out + sse_event(
            "content_block_start", {"type": "content_block_start", "index": self._block, "content_block": block}
        )

    def _close_block(self) -> bytes:
        if self._block_kind is None:
            return b""
        self._block_kind = None
        return sse_event("content_block_stop", {"type": "content_block_stop", "index": self._block})

    def _text_delta(self, text: str) -> bytes:
        out = b""
        if self._block_kind != "text":
            out += self._open({"type": "text", "text": ""}, "text")
        return out + sse_event(
            "content_block_delta",
            {"type": "content_block_delta", "index": self._block, "delta": {"type": "text_delta", "text": text}},
        )

    def _call_delta(self, tc: Mapping[str, Any]) -> bytes:
        out = b""
        index = int(tc.get("index", 0))
        fn = tc.get("function") or {}
        if index not in self._calls:
            out += self._open(
                {"type": "tool_use", "id": tc.get("id"), "name": fn.get("name") or "", "input": {}}, "tool_use"
            )
            self._calls[index] = self._block
        if fn.get("arguments"):
            out += sse_event(
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": self._calls[index],
                    "delta": {"type": "input_json_delta", "partial_json": fn["arguments"]},
                },
            )
        return out

    def close(self, error: str | None = None) -> bytes:
        if self._closed:
            return b""
        self._closed = True
        out = b"" if self._started else self._start({})
        if error is not None:
            return out + sse_event("error", {"type": "error", "error": {"type": "api_error", "message": error}})
        out += self._close_block()
        reported = self._usage or {}
        usage = {"output_tokens": int(reported.get("completion_tokens") or 0)}
        if reported.get("prompt_tokens") is not None:
            usage["input_tokens"] = int(reported["prompt_tokens"])
        delta = {"stop_reason": _stop(self._finish_reason or "stop", self.body), "stop_sequence": None}
        out += sse_event("message_delta", {"type": "message_delta", "delta": delta, "usage": usage})
        return out + sse_event("message_stop", {"type": "message_stop"})


DIALECT = Dialect(name="messages", to_chat=to_chat, from_chat=from_chat, stream=MessagesStream, response_id=response_id)
"""The Messages API as the gateway's routing uses it."""
