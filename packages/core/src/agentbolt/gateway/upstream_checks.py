"""What the gateway accepts from an upstream as a completion.

An upstream that answers ``200`` with a body that is not JSON, or with JSON that is not a
completion (an HTML error page, ``{}``, a proxy's own message), has failed: relaying it would
make the agent fail as if by its own fault, or worse, let the rollout succeed on garbage. The
gateway answers the agent with an OpenAI-style ``agentbolt_upstream_error`` instead, which
runners count as an infrastructure failure (retried while attempts remain).
"""

from __future__ import annotations

from typing import Any

import orjson

from .. import semconv
from .upstream import UpstreamTimeout

__all__ = ["failure", "parse_completion", "stream_problem"]


def _choice_problem(choice: Any, operation: str) -> str | None:
    if not isinstance(choice, dict):
        return "a choice is not an object"
    if operation == semconv.OP_CHAT:
        message = choice.get("message")
        if not isinstance(message, dict):
            return "a chat choice has no message object"
        content = message.get("content")
        if content is not None and not isinstance(content, str | list):
            return "a chat message's content is neither text, a list of parts nor null"
    elif not isinstance(choice.get("text"), str):
        return "a completion choice has no text"
    return None


def parse_completion(operation: str, body: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """``(response, None)`` for a well-formed completion, else ``(None, what is wrong)``."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        snippet = body[:200].decode("utf-8", "replace")
        return None, f"the upstream answered 200 with a body that is not JSON: {snippet!r}"
    if not isinstance(data, dict):
        return None, f"the upstream answered 200 with JSON that is not a completion object ({type(data).__name__})"
    if "error" in data and "choices" not in data:
        return None, f"the upstream answered 200 with an error: {str(data['error'])[:300]}"
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices:
        return None, "the upstream answered 200 with JSON that is not a completion (no choices)"
    for choice in choices:
        problem = _choice_problem(choice, operation)
        if problem is not None:
            return None, f"the upstream answered 200 with a malformed completion: {problem}"
    return data, None


def stream_problem(done: bool, choices: int) -> str | None:
    """What is wrong with a stream that ended (``data: [DONE]`` seen, choices assembled)."""
    if not done:
        return "the upstream's event stream ended without 'data: [DONE]'"
    if not choices:
        return "the upstream's event stream held no completion chunks"
    return None


def failure(exc: Exception | None, status: int | None, body: bytes, problem: str | None) -> tuple[str, int, str]:
    """``(error code, HTTP status for the client, message)`` of a failed upstream call: the
    exception it raised, else what is wrong with its 200 answer (``problem``), else its status."""
    if isinstance(exc, UpstreamTimeout):
        return "upstream_timeout", 504, str(exc)
    if exc is not None:
        return "upstream_unreachable", 502, str(exc)
    if problem is not None:
        return "upstream_invalid_response", 502, problem
    detail = body[:500].decode("utf-8", "replace")
    return f"upstream_status_{status}", 502, f"the upstream answered {status}: {detail}"
