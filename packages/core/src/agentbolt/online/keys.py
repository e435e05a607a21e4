"""What a live call says about its session, its task and its prompt (pure functions, no I/O).

A call's **session key**, first match wins:

1. the ``X-Agentbolt-Session-Id`` header;
2. ``metadata.session_id`` or ``metadata.conversation_id`` in the body (Chat Completions,
   Responses and Messages all carry a ``metadata`` object);
3. the trace id of a W3C ``traceparent`` header (an instrumented client's trace: one agent run);
4. none: the call is a session of its own.

Its **task key** (how GRPO groups sessions, see :mod:`agentbolt.online.grouping`): the
``X-Agentbolt-Task-Key`` header or ``metadata.task_key``. Its **prompt key**: a hash of the
session's question — the *last* user message of its first call (a conversation's first call has
one; an agent with a few-shot prompt sends worked examples first and the question last) —
normalized (case, whitespace), for grouping sessions that asked the same.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any, Literal

from ..gateway.recorder import parse_traceparent
from ..gateway.routing import RouteError
from ..rewards.trajectory import readable_text

__all__ = [
    "SESSION_HEADER",
    "TASK_HEADER",
    "KeySource",
    "prompt_key",
    "prompt_text",
    "safe_id",
    "session_key",
    "task_key",
]

SESSION_HEADER = "x-agentbolt-session-id"
"""Request header naming the session (echoed on every answer; auto sessions get one)."""
TASK_HEADER = "x-agentbolt-task-key"
"""Request header naming the task a session works on (sessions of one task form a GRPO group)."""

KeySource = Literal["header", "metadata", "trace", "call"]
_MAX_KEY = 256
_SAFE = re.compile(r"[A-Za-z0-9._~-]{1,96}")


def _checked(value: Any, what: str) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise RouteError(400, f"{what} must be a string, got {type(value).__name__}")
    if len(value) > _MAX_KEY or not value.isprintable():
        raise RouteError(400, f"{what} must be at most {_MAX_KEY} printable characters")
    return value


def _metadata(body: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = body.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def session_key(headers: Mapping[str, str], body: Mapping[str, Any]) -> tuple[str | None, KeySource]:
    """The session key of a call and where it came from (``None, "call"``: a session of its own)."""
    key = _checked(headers.get(SESSION_HEADER), "the X-Agentbolt-Session-Id header")
    if key is not None:
        return key, "header"
    meta = _metadata(body)
    for field in ("session_id", "conversation_id"):
        key = _checked(meta.get(field), f"metadata.{field}")
        if key is not None:
            return key, "metadata"
    trace_id, _ = parse_traceparent(headers.get("traceparent"))
    if trace_id is not None and trace_id != "0" * 32:
        return f"trace-{trace_id}", "trace"
    return None, "call"


def task_key(headers: Mapping[str, str], body: Mapping[str, Any]) -> str | None:
    """The client's task key (header, else ``metadata.task_key``), if any."""
    key = _checked(headers.get(TASK_HEADER), "the X-Agentbolt-Task-Key header")
    return key if key is not None else _checked(_metadata(body).get("task_key"), "metadata.task_key")


def prompt_text(body: Mapping[str, Any]) -> str:
    """The question of a Chat Completions, Responses or Messages request: the text of its last
    user message (the prompt of a completions request); empty when there is none.

    Read from a session's first call, this is what the user asked: a conversation's first call
    holds one user message, and a few-shot prompt puts its worked examples before the question.
    """
    items = body.get("messages")
    if items is None:
        items = body.get("input")
        if isinstance(items, str):
            return items
    if isinstance(items, list):
        for item in reversed(items):
            if isinstance(item, Mapping) and item.get("role") == "user":
                return readable_text(item.get("content"))
    prompt = body.get("prompt")
    return prompt if isinstance(prompt, str) else ""


def prompt_key(text: str) -> str | None:
    """A short hash of ``text`` with case and runs of whitespace normalized (``None`` if empty)."""
    normalized = " ".join(text.lower().split())
    if not normalized:
        return None
    return hashlib.sha256(normalized.encode()).hexdigest()[:16]


def safe_id(key: str) -> str:
    """``key`` as a rollout-id component: itself when short and plain, else a hash of it."""
    if _SAFE.fullmatch(key):
        return key
    return "h" + hashlib.sha256(key.encode()).hexdigest()[:32]
