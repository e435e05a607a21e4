"""What the API translations share: the error they raise, an SSE decoder, and the dialect record.

The gateway forwards every call to its upstreams as Chat Completions (the API that vLLM-style
backends answer with exact token ids). Clients that speak another API — the OpenAI Responses
API (``/v1/responses``, :mod:`.responses_api`) or the Anthropic Messages API (``/v1/messages``,
:mod:`.messages_api`) — are translated on the way in and on the way out; the recorded span holds
the Chat Completions request and response (with their token ids) plus the API the client used.

A translation is three pure pieces, bundled in a :class:`Dialect`:

- ``to_chat(body) -> chat_body`` (raises :class:`TranslationError` for what cannot be expressed),
- ``from_chat(chat_response, body) -> api_response``,
- ``stream(body)`` -> an object with ``feed(chunk: dict) -> bytes`` (one parsed Chat Completions
  SSE chunk in, the API's own SSE events out) and ``close(error: str | None) -> bytes``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

__all__ = ["Dialect", "SSEDecoder", "StreamTranslator", "TranslationError", "sse_event"]


class TranslationError(ValueError):
    """A request the gateway cannot express as Chat Completions (answered with HTTP 400)."""


class StreamTranslator(Protocol):
    """Turns a Chat Completions chunk stream into another API's event stream."""

    def feed(self, chunk: Mapping[str, Any]) -> bytes:
        """Events for one parsed Chat Completions chunk (may be empty)."""
        ...

    def close(self, error: str | None = None) -> bytes:
        """Final events: the completed response, or an error event when ``error`` is set."""
        ...


class ChunkStream:
    """Base of the streaming translators: walks each Chat Completions chunk's first choice and
    hands its text and tool-call deltas to the subclass, which writes its API's events."""

    def __init__(self, body: Mapping[str, Any]) -> None:
        self.body = body
        self._started = False
        self._usage: Mapping[str, Any] | None = None
        self._finish_reason: str | None = None
        self._closed = False

    def feed(self, chunk: Mapping[str, Any]) -> bytes:
        """Events for one parsed Chat Completions chunk (may be empty)."""
        out = b""
        if not self._started:
            self._started = True
            out += self._start(chunk)
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            if int(choice.get("index", 0)) != 0:
                continue
            delta = choice.get("delta") or {}
            if delta.get("content"):
                out += self._text_delta(str(delta["content"]))
            for tc in delta.get("tool_calls") or ():
                out += self._call_delta(tc)
            if choice.get("finish_reason"):
                self._finish_reason = choice["finish_reason"]
        return out

    def _start(self, chunk: Mapping[str, Any]) -> bytes:
        """The opening events, from the first chunk."""
        raise NotImplementedError

    def _text_delta(self, text: str) -> bytes:
        """Events for a piece of the reply's text."""
        raise NotImplementedError

    def _call_delta(self, tc: Mapping[str, Any]) -> bytes:
        """Events for a piece of a tool call (a Chat Completions ``delta.tool_calls`` entry)."""
        raise NotImplementedError


@dataclass(frozen=True)
class Dialect:
    """One client API the gateway translates to Chat Completions."""

    name: str
    """Recorded on the span as ``agentbolt.llm.api`` (``responses``, ``messages``)."""
    to_chat: Callable[[Mapping[str, Any]], dict[str, Any]]
    from_chat: Callable[[Mapping[str, Any], Mapping[str, Any]], dict[str, Any]]
    stream: Callable[[Mapping[str, Any]], StreamTranslator]
    response_id: Callable[[str], str]
    """The id the client receives for an upstream Chat Completions id (recorded as ``gen_ai.response.id``)."""


def sse_event(event: str, data: Mapping[str, Any]) -> bytes:
    """One server-sent event with an ``event:`` name, as both APIs send them."""
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


class SSEDecoder:
    """Splits raw Chat Completions SSE bytes (any split) into parsed ``data:`` payloads.

    Yields each JSON object; ``[DONE]`` yields nothing but sets :attr:`done`.
    """

    def __init__(self) -> None:
        self._buffer = b""
        self.done = False

    def feed(self, data: bytes) -> Iterator[dict[str, Any]]:
        self._buffer += data
        while True:
            cut = self._buffer.find(b"\n\n")
            if cut < 0:
                return
            event, self._buffer = self._buffer[:cut], self._buffer[cut + 2 :]
            for line in event.split(b"\n"):
                line = line.rstrip(b"\r")
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    self.done = True
                    continue
                try:
                    chunk = orjson.loads(payload)
                except orjson.JSONDecodeError:
                    continue
                if isinstance(chunk, dict):
                    yield chunk


def text_of(content: Any, *, allowed: tuple[str, ...], api: str) -> str:
    """The text of a content value: a string, or a list of text parts of the ``allowed`` types."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise TranslationError(f"{api}: content must be a string or a list of parts, got {type(content).__name__}")
    texts = []
    for part in content:
        if isinstance(part, str):
            texts.append(part)
            continue
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind not in allowed:
            raise TranslationError(
                f"{api}: content part type {kind!r} is not supported by the agentbolt gateway "
                f"(supported: {', '.join(allowed)}); send text"
            )
        texts.append(str(part.get("text") or ""))
    return "".join(texts)


def function_tool(tool: Mapping[str, Any], *, schema: str, strict: bool = False) -> dict[str, Any]:
    """The Chat Completions ``function`` tool of another API's client tool: its name, the JSON
    schema under ``schema`` (an empty object schema when missing), its description and, with
    ``strict``, its ``strict`` flag when set."""
    fn: dict[str, Any] = {"name": tool["name"], "parameters": tool.get(schema) or {"type": "object"}}
    if tool.get("description"):
        fn["description"] = tool["description"]
    if strict and tool.get("strict") is not None:
        fn["strict"] = tool["strict"]
    return {"type": "function", "function": fn}


def stream_options(chat: dict[str, Any]) -> None:
    """Ask a streaming upstream for the usage chunk (both APIs report usage at the end)."""
    if chat.get("stream"):
        chat["stream_options"] = {"include_usage": True}


def choice0(chat: Mapping[str, Any]) -> Mapping[str, Any]:
    choices = chat.get("choices") or []
    return choices[0] if choices else {}
