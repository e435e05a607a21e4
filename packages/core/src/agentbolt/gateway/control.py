"""The gateway's control routes (``/gateway/*``): request bodies, edge checks and OpenAPI.

Every control request is checked once, here, before it touches the gateway:

- bodies are pydantic models with bounds (finite numbers, 64-bit integers, known fields), so a
  malformed request is a 4xx with a message, never a 500;
- with no token (the loopback default) a web page in the user's browser must not be able to
  drive the gateway: requests whose ``Host`` is not a loopback name (DNS rebinding) or a
  configured one are refused, and ``POST`` bodies must be ``application/json`` (a browser sends
  that cross-site only after a CORS preflight, which the gateway never approves).
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Mapping
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from .. import __version__
from .. import types as t
from ..hosts import host_name, is_loopback_name

__all__ = [
    "DrainRequest",
    "PolicyRequest",
    "UpstreamModel",
    "UpstreamsRequest",
    "bearer_matches",
    "host_allowed",
    "is_json",
    "openapi_document",
    "validation_message",
]

_BODY = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, use_attribute_docstrings=True)


class PolicyRequest(BaseModel):
    """``POST /gateway/policy``: the policy version recorded on spans, forced sampling and model."""

    model_config = _BODY

    version: t.NonNegInt64 | None = None
    """Policy version recorded on spans (unchanged when omitted)."""
    sampling: t.JsonDict | None = None
    """Sampling parameters forced into every request (unchanged when omitted)."""
    model: Annotated[str, Field(min_length=1, max_length=512)] | None = None
    """Model name forced into every request (unchanged when omitted)."""


def check_upstream_url(url: str) -> str:
    """An ``http(s)://host[:port][/prefix]`` URL that parses (host and port included)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError as exc:
        raise ValueError(f"upstream URL {url!r} does not parse: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"upstream URL must be http(s)://host[:port][/prefix], got {url!r}")
    return url


class UpstreamModel(BaseModel):
    """An OpenAI-compatible endpoint."""

    model_config = _BODY

    base_url: Annotated[
        str, Field(pattern=r"^https?://[^/\s?#]+(/[^\s?#]*)?$", max_length=2048), AfterValidator(check_upstream_url)
    ]
    """Base URL including ``/v1``, e.g. ``http://127.0.0.1:8000/v1``."""
    api_key: Annotated[str, Field(max_length=4096)] | None = None
    """Sent as ``Authorization: Bearer`` to the upstream."""
    model: Annotated[str, Field(max_length=512)] | None = None
    """Model name the upstream serves; forced into every request when set."""


class UpstreamsRequest(BaseModel):
    """``POST /gateway/upstreams``: replace the upstreams."""

    model_config = _BODY

    upstreams: Annotated[list[UpstreamModel], Field(max_length=1024)]
    """The new upstreams (an empty list: calls get 503 until some are set)."""


class DrainRequest(BaseModel):
    """``POST /gateway/drain``: wait until no call is in flight."""

    model_config = _BODY

    timeout: Annotated[float, Field(ge=0, le=24 * 3600)] | None = None
    """Seconds to wait at most (``null``: until drained)."""


class EmptyRequest(BaseModel):
    """``POST /gateway/pause``, ``resume``, ``flush``: no fields."""

    model_config = _BODY


BODIES: dict[str, type[BaseModel]] = {
    "/gateway/policy": PolicyRequest,
    "/gateway/upstreams": UpstreamsRequest,
    "/gateway/drain": DrainRequest,
    "/gateway/pause": EmptyRequest,
    "/gateway/resume": EmptyRequest,
    "/gateway/flush": EmptyRequest,
}
"""Control routes taking ``POST`` and the model of their body."""


def validation_message(exc: ValidationError) -> str:
    """One line naming each problem of a rejected body (at most five)."""
    parts = []
    for problem in exc.errors(include_url=False, include_input=False)[:5]:
        loc = ".".join(str(x) for x in problem.get("loc", ())) or "body"
        parts.append(f"{loc}: {problem.get('msg', 'invalid')}")
    return "invalid request: " + "; ".join(parts)


def host_allowed(header: str | None, allowed: Iterable[str]) -> bool:
    """True when the ``Host`` header names a loopback address or one of ``allowed``."""
    if not header:
        return False
    host = host_name(header)
    return is_loopback_name(host) or host in {h.lower() for h in allowed}


def is_json(content_type: str | None) -> bool:
    """True for ``application/json`` (parameters allowed) and ``+json`` media types."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


def bearer_matches(authorization: str | None, token: str) -> bool:
    """``Authorization: Bearer <token>``, the scheme case-insensitive (RFC 7235), in constant time."""
    scheme, _, value = (authorization or "").strip().partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), token.encode())


def _schema(model: type[BaseModel], components: dict[str, Any]) -> dict[str, Any]:
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    for name, sub in schema.pop("$defs", {}).items():
        components.setdefault(name, sub)
    components[model.__name__] = schema
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _error_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["message", "type"],
                "properties": {
                    "message": {"type": "string"},
                    "type": {"type": "string"},
                    "code": {"type": ["string", "null"]},
                    "param": {"type": ["string", "null"]},
                },
            }
        },
    }


def openapi_document(*, secured: bool, extra_paths: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The gateway's OpenAPI 3.1 document: control routes and the OpenAI-compatible routes."""
    components: dict[str, Any] = {"Error": _error_schema()}
    error = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    errors = {
        str(code): {"description": text, "content": error}
        for code, text in {
            400: "Malformed request.",
            401: "Missing or wrong bearer token.",
            404: "Unknown route, rollout or attempt.",
            405: "Wrong method.",
            409: "The attempt has ended.",
            413: "Request too large.",
            415: "The body is not JSON.",
            421: "A Host the gateway does not serve (tokenless gateways answer loopback names only).",
            422: "The body does not match the route's schema.",
            502: "The upstream failed (`agentbolt_upstream_error`).",
            503: "Paused, or no upstream configured.",
            504: "The upstream timed out.",
        }.items()
    }
    stats = {"description": "Gateway counters.", "content": {"application/json": {"schema": {"type": "object"}}}}
    paths: dict[str, Any] = {
        "/gateway/health": {
            "get": {
                "operationId": "health",
                "summary": "Liveness (no token needed).",
                "security": [],
                "responses": {"200": {"description": "ok", "content": {"application/json": {"schema": {}}}}},
            }
        },
        "/gateway/stats": {"get": {"operationId": "stats", "summary": "Counters.", "responses": {"200": stats}}},
    }
    for route, model in BODIES.items():
        name = route.rsplit("/", 1)[1]
        paths[route] = {
            "post": {
                "operationId": name,
                "summary": (model.__doc__ or "").strip().splitlines()[0],
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _schema(model, components)}},
                },
                "responses": {"200": stats, **errors},
            }
        }
    completion = {"type": "object", "description": "An OpenAI-compatible request body (forwarded upstream)."}
    for sub in ("chat/completions", "completions"):
        paths[f"/rollouts/{{rollout_id}}/attempts/{{attempt_id}}/v1/{sub}"] = {
            "post": {
                "operationId": sub.replace("/", "_"),
                "summary": f"OpenAI-compatible /v1/{sub}, recorded in the attempt's spans.",
                "parameters": [
                    {"name": "rollout_id", "in": "path", "required": True, "schema": {"type": "string"}},
                    {"name": "attempt_id", "in": "path", "required": True, "schema": {"type": "string"}},
                ],
                "requestBody": {"required": True, "content": {"application/json": {"schema": completion}}},
                "responses": {
                    "200": {"description": "The upstream's answer.", "content": {"application/json": {"schema": {}}}},
                    **errors,
                },
            }
        }
    paths["/v1/models"] = {
        "get": {
            "operationId": "models",
            "summary": "Models served.",
            "responses": {"200": {"description": "ok", "content": {"application/json": {"schema": {}}}}},
        }
    }
    paths.update(extra_paths or {})
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": "agentbolt gateway",
            "version": __version__,
            "description": "OpenAI-compatible proxy that records every LLM call of every rollout.",
        },
        "paths": paths,
        "components": {"schemas": components},
    }
    if secured:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        doc["security"] = [{"bearer": []}]
    return doc
