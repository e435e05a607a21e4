"""The OpenAI Responses API (``POST /v1/responses``) as Chat Completions, and back.

Pure functions, no I/O: the gateway calls :func:`to_chat` on the request, forwards the result,
and answers with :func:`from_chat` (or a :class:`ResponsesStream` for ``stream: true``), so an
agent on the Responses API (the OpenAI Agents SDK's default model, LangChain's
``ChatOpenAI(use_responses_api=True)``) is recorded with the upstream's exact token ids.

Supported: ``input`` as a string or a list of message / ``function_call`` /
``function_call_output`` items (``reasoning`` items are dropped), ``instructions``, function
tools, ``tool_choice``, ``parallel_tool_calls``, ``max_output_tokens``, ``temperature``,
``top_p``, ``text.format`` (JSON schema / JSON object), streaming. Not supported (HTTP 400 with
the reason): ``previous_response_id`` and item references (the gateway keeps no conversation
state: send the whole input, ``store=False``), hosted tools (web or file search, computer use).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from . import translate
from .translate import ChunkStream, Dialect, TranslationError, choice0, sse_event, stream_options, text_of

__all__ = ["DIALECT", "ResponsesStream", "from_chat", "response_id", "to_chat"]

_API = "/v1/responses"
_TEXT_PARTS = ("input_text", "output_text", "text", "refusal")
_IGNORED = {"store", "include", "metadata", "truncation", "reasoning", "service_tier", "prompt_cache_key", "background"}
_PASSED = ("temperature", "top_p", "parallel_tool_calls", "user", "seed", "top_logprobs")


def response_id(chat_id: str) -> str:
    """The Responses id for an upstream Chat Completions id."""
    return f"resp_{chat_id}"


def _tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    if tool.get("type") != "function":
        raise TranslationError(
            f"{_API}: tool type {tool.get('type')!r} is a hosted tool the agentbolt gateway cannot run; "
            "only function tools are supported"
        )
    return translate.function_tool(tool, schema="parameters", strict=True)


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, str):
        return choice
    if isinstance(choice, Mapping) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    raise TranslationError(f"{_API}: tool_choice {choice!r} is not supported (use auto, none, required or a function)")


def _content(content: Any) -> Any:
    """Message content as Chat Completions content (text, or text and image parts)."""
    if isinstance(content, list) and any(isinstance(p, Mapping) and p.get("type") == "input_image" for p in content):
        parts: list[dict[str, Any]] = []
        for p in content:
            if p.get("type") == "input_image":
                if not p.get("image_url"):
                    raise TranslationError(f"{_API}: input_image needs an image_url (file ids are not supported)")
                parts.append({"type": "image_url", "image_url": {"url": p["image_url"]}})
            else:
                parts.append({"type": "text", "text": text_of([p], allowed=_TEXT_PARTS, api=_API)})
        return parts
    return text_of(content, allowed=_TEXT_PARTS, api=_API)


def _messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": text_of(body["instructions"], allowed=_TEXT_PARTS, api=_API)})
    items = body.get("input")
    if isinstance(items, str):
        return [*messages, {"role": "user", "content": items}]
    if not isinstance(items, list):
        raise TranslationError(f"{_API}: input must be a string or a list of items")
    for item in items:
        if not isinstance(item, Mapping):
            raise TranslationError(f"{_API}: every input item must be an object")
        kind = item.get("type") or "message"
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise TranslationError(f"{_API}: message role {role!r} is not supported")
            content = _content(item.get("content"))
            last = messages[-1] if messages else None
            if role == "assistant" and last is not None and last["role"] == "assistant" and not last.get("tool_calls"):
                last["content"] = (last.get("content") or "") + (content if isinstance(content, str) else "")
                continue
            messages.append({"role": "system" if role == "developer" else role, "content": content})
        elif kind == "function_call":
            call = {
                "id": item.get("call_id") or item.get("id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments") or "{}"},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
                if last.get("content") == "":
                    last["content"] = None
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else text_of(output, allowed=_TEXT_PARTS, api=_API)
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": text})
        elif kind == "reasoning":
            continue
        elif kind == "item_reference":
            raise TranslationError(
                f"{_API}: item references need server-side state the agentbolt gateway does not keep; "
                "send the items themselves"
            )
        else:
            raise TranslationError(f"{_API}: input item type {kind!r} is not supported")
    return messages


def to_chat(body: Mapping[str, Any]) -> dict[str, Any]:
    """The Chat Completions request for a Responses API request."""
    if body.get("previous_response_id") or body.get("conversation"):
        raise TranslationError(
            f"{_API}: previous_response_id / conversation need server-side state the agentbolt gateway does not "
            "keep; send the whole conversation as input (the Agents SDK does unless told otherwise)"
        )
    chat: dict[str, Any] = {"model": body.get("model", ""), "messages": _messages(body)}
    if body.get("tools"):
        chat["tools"] = [_tool(t) for t in body["tools"]]
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    for key in _PASSED:
        if body.get(key) is not None:
            chat[key] = body[key]
    fmt = (body.get("text") or {}).get("format") or {}
    if fmt.get("type") == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        chat["response_format"] = {"type": "json_schema", "json_schema": schema}
    elif fmt.get("type") == "json_object":
        chat["response_format"] = {"type": "json_object"}
    if body.get("stream"):
        chat["stream"] = True
        stream_options(chat)
    return chat


def _usage(usage: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not usage:
        return None
    prompt, completion = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


def _envelope(body: Mapping[str, Any], rid: str, model: str, created: float, status: str) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "response",
        "created_at": created,
        "status": status,
        "model": model,
        "output": [],
        "instructions": body.get("instructions"),
        "tools": list(body.get("tools") or []),
        "tool_choice": body.get("tool_choice") or "auto",
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "max_output_tokens": body.get("max_output_tokens"),
        "text": body.get("text") or {"format": {"type": "text"}},
        "metadata": body.get("metadata") or {},
        "error": None,
        "incomplete_details": None,
        "usage": None,
    }


def _message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {
        "type": "message",
        "id": item_id,
        "role": "assistant",
        "status": status,
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if text else [],
    }


def _call_item(item_id: str, call_id: str, name: str, arguments: str, status: str = "completed") -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def _finish(out: dict[str, Any], finish_reason: str | None) -> None:
    if finish_reason == "length":
        out["status"] = "incomplete"
        out["incomplete_details"] = {"reason": "max_output_tokens"}
    elif finish_reason == "content_filter":
        out["status"] = "incomplete"
        out["incomplete_details"] = {"reason": "content_filter"}


def from_chat(chat: Mapping[str, Any], body: Mapping[str, Any]) -> dict[str, Any]:
    """The Responses API response for a Chat Completions response."""
    rid = response_id(str(chat.get("id") or ""))
    out = _envelope(
        body, rid, str(chat.get("model") or body.get("model") or ""), float(chat.get("created") or 0), "completed"
    )
    choice = choice0(chat)
    message = choice.get("message") or {}
    if message.get("content"):
        out["output"].append(_message_item(f"msg_{rid[5:]}", str(message["content"])))
    for i, call in enumerate(message.get("tool_calls") or ()):
        fn = call.get("function") or {}
        out["output"].append(
            _call_item(
                f"fc_{rid[5:]}_{i}", call.get("id") or f"call_{i}", fn.get("name", ""), fn.get("arguments") or ""
            )
        )
    _finish(out, choice.get("finish_reason"))
    out["usage"] = _usage(chat.get("usage"))
    return out


class ResponsesStream(ChunkStream):
    """Responses API streaming events for a Chat Completions chunk stream (see the module docstring)."""

    def __init__(self, body: Mapping[str, Any]) -> None:
        super().__init__(body)
        self._seq = 0
        self._rid = ""
        self._response: dict[str, Any] = {}
        self._text: list[str] = []
        self._text_index: int | None = None
        self._calls: dict[int, dict[str, Any]] = {}  # chat tool-call index -> item
        self._items: list[dict[str, Any]] = []  # output items in order

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return sse_event(kind, data)

    def _start(self, chunk: Mapping[str, Any]) -> bytes:
        self._rid = response_id(str(chunk.get("id") or ""))
        model = str(chunk.get("model") or self.body.get("model") or "")
        self._response = _envelope(
            self.body, self._rid, model, float(chunk.get("created") or time.time()), "in_progress"
        )
        return self._event("response.created", response=dict(self._response)) + self._event(
            "response.in_progress", response=dict(self._response)
        )

    def _text_delta(self, text: str) -> bytes:
        out = b""
        item_id = f"msg_{self._rid[5:]}"
        if self._text_index is None:
            self._text_index = len(self._items)
            self._items.append(_message_item(item_id, "", "in_progress"))
            out += self._event("response.output_item.added", output_index=self._text_index, item=self._items[-1])
            out += self._event(
                "response.content_part.added",
                item_id=item_id,
                output_index=self._text_index,
                content_index=0,
                part={"type": "output_text", "text": "", "annotations": [], "logprobs": []},
            )
        self._text.append(text)
        return out + self._event(
            "response.output_text.delta",
            item_id=item_id,
            output_index=self._text_index,
            content_index=0,
            delta=text,
            logprobs=[],
        )

    def _call_delta(self, tc: Mapping[str, Any]) -> bytes:
        out = b""
        index = int(tc.get("index", 0))
        fn = tc.get("function") or {}
        item = self._calls.get(index)
        if item is None:
            item = _call_item(
                f"fc_{self._rid[5:]}_{index}", tc.get("id") or f"call_{index}", fn.get("name") or "", "", "in_progress"
            )
            item["output_index"] = len(self._items)
            self._calls[index] = item
            self._items.append(item)
            shown = {k: v for k, v in item.items() if k != "output_index"}
            out += self._event("response.output_item.added", output_index=item["output_index"], item=shown)
        elif fn.get("name"):
            item["name"] += fn["name"]
        if fn.get("arguments"):
            item["arguments"] += fn["arguments"]
            out += self._event(
                "response.function_call_arguments.delta",
                item_id=item["id"],
                output_index=item["output_index"],
                delta=fn["arguments"],
            )
        return out

    def close(self, error: str | None = None) -> bytes:
        if self._closed:
            return b""
        self._closed = True
        out = b""
        if not self._started:
            out += self._start({})
        if error is not None:
            return out + self._event("error", code="agentbolt_upstream_error", message=error, param=None)
        output = []
        for index, item in enumerate(self._items):
            if item["type"] == "message":
                text = "".join(self._text)
                done = _message_item(item["id"], text)
                part = done["content"][0]
                out += self._event(
                    "response.output_text.done",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    text=text,
                    logprobs=[],
                )
                out += self._event(
                    "response.content_part.done", item_id=item["id"], output_index=index, content_index=0, part=part
                )
            else:
                done = _call_item(item["id"], item["call_id"], item["name"], item["arguments"])
                out += self._event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    arguments=item["arguments"],
                    name=item["name"],
                )
            out += self._event("response.output_item.done", output_index=index, item=done)
            output.append(done)
        final = {**self._response, "status": "completed", "output": output, "usage": _usage(self._usage)}
        _finish(final, self._finish_reason)
        kind = "response.completed" if final["status"] == "completed" else "response.incomplete"
        return out + self._event(kind, response=final)


DIALECT = Dialect(
    name="responses", to_chat=to_chat, from_chat=from_chat, stream=ResponsesStream, response_id=response_id
)
"""The Responses API as the gateway's routing uses it."""
