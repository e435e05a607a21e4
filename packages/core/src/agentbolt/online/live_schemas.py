"""OpenAPI path items of the live client routes of ``agentbolt serve`` (``/v1/chat/completions``,
``/v1/completions``, ``/v1/responses``, ``/v1/messages``).

The schemas describe the request fields the gateway itself reads (the session and task keys, the
messages it records and translates, ``stream``); any other field is forwarded to the upstream as
is. Bounds on lengths and counts keep generated examples small: they describe what a fuzzer
should send, the gateway accepts longer input (up to its body limit). ``schemathesis`` runs on
this document in tests/core/online/test_fuzz_serve.py against a live upstream.
"""

from __future__ import annotations

from typing import Any

from .keys import SESSION_HEADER, TASK_HEADER

__all__ = ["live_openapi_paths"]

_TEXT = {"type": "string", "maxLength": 200}
_PARTS = {
    "type": "array",
    "maxItems": 3,
    "items": {
        "type": "object",
        "required": ["type", "text"],
        "properties": {"type": {"const": "text"}, "text": {"type": "string", "maxLength": 100}},
    },
}
_CONTENT = {"anyOf": [_TEXT, _PARTS]}
_METADATA = {
    "type": "object",
    "description": "session_id / conversation_id name the session, task_key its task (agentbolt's keys).",
    "properties": {
        "session_id": {"type": "string", "maxLength": 64},
        "conversation_id": {"type": "string", "maxLength": 64},
        "task_key": {"type": "string", "maxLength": 64},
    },
    "additionalProperties": {"type": "string", "maxLength": 64},
    "maxProperties": 4,
}
_TOKENS = {"type": "integer", "minimum": 1, "maximum": 64}
_COMMON = {
    "model": {"type": "string", "maxLength": 64},
    "stream": {"type": "boolean"},
    "temperature": {"type": "number", "minimum": 0, "maximum": 2},
    "metadata": _METADATA,
}


def _messages(roles: list[str], content: dict[str, Any]) -> dict[str, Any]:
    """1 to 4 messages, each a ``role`` of ``roles`` and a ``content``."""
    return {
        "type": "array",
        "minItems": 1,
        "maxItems": 4,
        "items": {
            "type": "object",
            "required": ["role", "content"],
            "properties": {"role": {"enum": roles}, "content": content},
        },
    }


_BODIES: dict[str, tuple[str, dict[str, Any]]] = {
    "/v1/chat/completions": (
        "OpenAI Chat Completions",
        {
            "type": "object",
            "required": ["messages"],
            "properties": {
                **_COMMON,
                "messages": _messages(["system", "user", "assistant"], _CONTENT),
                "max_tokens": _TOKENS,
                "n": {"type": "integer", "minimum": 1, "maximum": 2},
                "stop": {"anyOf": [_TEXT, {"type": "array", "maxItems": 4, "items": _TEXT}]},
            },
        },
    ),
    "/v1/completions": (
        "OpenAI Completions",
        {
            "type": "object",
            "required": ["prompt"],
            "properties": {**_COMMON, "prompt": _TEXT, "max_tokens": _TOKENS},
        },
    ),
    "/v1/responses": (
        "OpenAI Responses API (translated to Chat Completions upstream)",
        {
            "type": "object",
            "required": ["input"],
            "properties": {
                **_COMMON,
                "input": {"anyOf": [_TEXT, _messages(["system", "developer", "user", "assistant"], _TEXT)]},
                "instructions": _TEXT,
                "max_output_tokens": _TOKENS,
            },
        },
    ),
    "/v1/messages": (
        "Anthropic Messages API (translated to Chat Completions upstream)",
        {
            "type": "object",
            "required": ["max_tokens", "messages"],
            "properties": {
                **_COMMON,
                "temperature": {"type": "number", "minimum": 0, "maximum": 1},
                "max_tokens": _TOKENS,
                "system": _TEXT,
                "messages": _messages(["user", "assistant"], _CONTENT),
                "stop_sequences": {"type": "array", "maxItems": 4, "items": _TEXT},
            },
        },
    ),
}


def live_openapi_paths() -> dict[str, Any]:
    """Path items of the live client routes (session recorded, ``X-Agentbolt-Session-Id`` answered)."""
    error = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    texts = {
        400: "Malformed request, or one the Responses/Messages translation cannot express.",
        401: "Missing or wrong bearer token.",
        413: "Request too large.",
        415: "The body is not JSON.",
        421: "A Host the server does not answer.",
        422: "The upstream refused the request (passed through).",
        502: "The upstream failed (`agentbolt_upstream_error`).",
        503: "No upstream, or the store could not open the session.",
        504: "The upstream timed out.",
    }
    headers = [
        {"name": SESSION_HEADER, "in": "header", "required": False, "schema": {"type": "string", "maxLength": 300}},
        {"name": TASK_HEADER, "in": "header", "required": False, "schema": {"type": "string", "maxLength": 64}},
    ]
    paths: dict[str, Any] = {}
    for route, (api, schema) in _BODIES.items():
        paths[route] = {
            "post": {
                "operationId": "live_" + route.removeprefix("/v1/").replace("/", "_"),
                "summary": f"{api}; the call is recorded into its session.",
                "parameters": headers,
                "requestBody": {"required": True, "content": {"application/json": {"schema": schema}}},
                "responses": {
                    "200": {
                        "description": "The answer (JSON, or server-sent events with stream=true).",
                        "content": {"application/json": {"schema": {}}, "text/event-stream": {"schema": {}}},
                    },
                    **{str(c): {"description": t, "content": error} for c, t in texts.items()},
                },
            }
        }
    return paths
