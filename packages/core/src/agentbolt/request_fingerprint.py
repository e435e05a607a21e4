"""Fingerprints of a chat request's messages: how a framework's LLM span finds the gateway call it made.

The gateway records, on every LLM-call span, the fingerprints of the messages it forwarded
(``agentbolt.llm.request_fingerprint``). An instrumentation's LLM span that records the messages
it was given (``gen_ai.input.messages``, or OpenInference's ``llm.input_messages``) has the same
fingerprints, so LightningRL joins the two even when nothing else links them: a streamed call
whose HTTP request is sent after the instrumentation's span has ended (LlamaIndex's
``astream_chat``), a client that propagates no ``traceparent``, a framework that records no
response id.

Two fingerprints, from strict to loose, both SHA-256 (hex, 16 bytes) of normalized messages:

- ``full``: every message's role and text, in order;
- ``tail``: the number of messages and the role and text of the last one (the new user message
  or tool result of this turn), for frameworks that render earlier turns differently.

Normalization keeps what every framework passes on unchanged: the role (``developer`` read as
``system``) and the text (a string, or the text parts of a content list / GenAI ``parts``
joined, whitespace stripped; ``None`` is ``""``). Tool-call arguments, images and names are
left out: frameworks re-serialize them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

import orjson

__all__ = ["FULL", "TAIL", "fingerprints", "normalized_messages"]

FULL: Final = 0
"""Index of the ``full`` fingerprint in the list :func:`fingerprints` returns."""
TAIL: Final = 1
"""Index of the ``tail`` fingerprint."""

_ROLES: Final = {"developer": "system", "human": "user", "ai": "assistant", "model": "assistant", "function": "tool"}


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content.strip()
    if isinstance(content, Sequence) and not isinstance(content, bytes | bytearray):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, Mapping) and part.get("type", "text") == "text":
                value = part.get("text", part.get("content"))
                if isinstance(value, str):
                    parts.append(value)
        return "".join(parts).strip()
    return str(content).strip()


def normalized_messages(messages: Any) -> list[tuple[str, str]] | None:
    """(role, text) of each message, or ``None`` when ``messages`` (a list, or its JSON) is not a
    list of messages. Accepts OpenAI chat messages (``content``) and OpenTelemetry GenAI
    messages (``parts``)."""
    if isinstance(messages, str):
        try:
            messages = json.loads(messages)
        except ValueError:
            return None
    if not isinstance(messages, list) or not messages:
        return None
    out = []
    for message in messages:
        if not isinstance(message, Mapping):
            return None
        role = str(message.get("role") or "").strip().lower()
        text = _text(message.get("parts") if "parts" in message else message.get("content"))
        out.append((_ROLES.get(role, role), text))
    return out


def _digest(value: Any) -> str:
    # orjson writes the same bytes as ``json.dumps(value, ensure_ascii=False, separators=(",", ":"))``
    # for these lists of strings and ints (the fingerprints of earlier runs still match), at a
    # fraction of the cost: the gateway fingerprints every call it forwards.
    return hashlib.sha256(orjson.dumps(value)).hexdigest()[:32]


def fingerprints(messages: Any) -> list[str] | None:
    """``[full, tail]`` fingerprints of ``messages`` (see the module docstring), or ``None``
    when they are not a list of messages."""
    normalized = normalized_messages(messages)
    if normalized is None:
        return None
    return [_digest(normalized), _digest([len(normalized), normalized[-1]])]
