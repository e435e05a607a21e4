"""The store server's error responses: which HTTP status and wire ``type`` each agentbolt error
travels as, and the JSON error body every refusal and failure answers with (the traceback of an
unexpected error goes to the server log, never into a response)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import orjson
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from ... import errors
from ...errors import (
    AgentboltError,
    ConflictError,
    InvalidTransitionError,
    NotFoundError,
    SchemaError,
    StaleAttemptError,
    StoreUnavailableError,
    UserError,
)
from .. import wire as w

__all__ = ["ERROR_DOCS", "JSON", "BodyTooLarge", "error", "error_response", "error_status"]

log = logging.getLogger(__name__)

JSON = "application/json"

# Status of each agentbolt error; the first class in the exception's MRO that is listed wins.
_ERROR_STATUS: dict[type[BaseException], int] = {
    NotFoundError: 404,
    StaleAttemptError: 409,
    InvalidTransitionError: 409,
    ConflictError: 409,
    StoreUnavailableError: 503,
    SchemaError: 422,
    UserError: 400,
    AgentboltError: 500,
}

ERROR_DOCS: dict[int | str, dict[str, Any]] = {
    code: {"model": w.ErrorResponse, "description": text}
    for code, text in {
        400: "The store refused the call as misuse (`UserError`).",
        401: "Missing or wrong bearer token.",
        404: "An id does not exist (`NotFoundError`).",
        409: "`ConflictError`, `StaleAttemptError` or `InvalidTransitionError`.",
        413: "The request body is larger than the server accepts.",
        415: "The request body is not `application/json`.",
        422: "Malformed request (`ValidationError`) or data (`SchemaError`).",
        503: "The store is unavailable (`StoreUnavailableError`); safe to retry.",
    }.items()
}


def error_status(exc: BaseException) -> tuple[int, str]:
    """HTTP status and wire ``type`` of an exception raised by a store.

    The type is the exception's class when agentbolt defines it, else the nearest agentbolt
    base class (a plugin's ``RedisDownError(StoreUnavailableError)`` travels as
    ``StoreUnavailableError``), so clients can always rebuild it.
    """
    for cls in type(exc).__mro__:
        if cls in _ERROR_STATUS:
            known = next(c for c in type(exc).__mro__ if getattr(errors, c.__name__, None) is c)
            return _ERROR_STATUS[cls], known.__name__
    return 500, "InternalServerError"


def error(status: int, type_: str, message: str, headers: Mapping[str, str] | None = None, **extra: Any) -> Response:
    """``{"error": {"type": ..., "message": ..., **extra}}`` with ``status``."""
    body = {"error": {"type": type_, "message": message, **{k: v for k, v in extra.items() if v is not None}}}
    return Response(orjson.dumps(body, default=str), status_code=status, media_type=JSON, headers=headers)


def _validation_message(problems: Any) -> str:
    parts = []
    for problem in list(problems)[:10]:
        loc = ".".join(str(x) for x in problem.get("loc", ()) if x != "body") or "body"
        msg = problem.get("msg", "invalid")
        ctx = problem.get("ctx") or {}
        if problem.get("type") == "json_invalid":
            msg = f"invalid JSON: {ctx.get('error', msg)}"
        parts.append(f"{loc}: {msg}")
    more = len(list(problems)) - len(parts)
    return "invalid request: " + "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


def error_response(exc: BaseException, request: Request | None = None) -> Response:
    """The JSON error response for an exception raised while serving a request."""
    if isinstance(exc, AgentboltError):
        status, type_ = error_status(exc)
        if status == 500:
            log.error("store error serving %s: %s", _where(request), exc)
        if isinstance(exc, NotFoundError):
            return error(status, type_, str(exc), what=getattr(exc, "what", None), ids=getattr(exc, "ids", None))
        return error(status, type_, str(exc))
    if isinstance(exc, RequestValidationError):
        return error(422, "ValidationError", _validation_message(exc.errors()))
    if isinstance(exc, ValidationError):
        return error(422, "ValidationError", _validation_message(exc.errors(include_url=False, include_input=False)))
    if isinstance(exc, BodyTooLarge):
        return error(413, "RequestTooLarge", str(exc.detail))
    if isinstance(exc, StarletteHTTPException):
        return error(exc.status_code, "HTTPError", str(exc.detail), headers=exc.headers)
    log.error("unexpected error serving %s", _where(request), exc_info=exc)
    return error(500, "InternalServerError", "internal server error; the traceback is in the store server's log")


def _where(request: Request | None) -> str:
    return "a request" if request is None else f"{request.method} {request.url.path}"


class BodyTooLarge(StarletteHTTPException):
    """A body without ``Content-Length`` ran past the limit (an HTTP error, so FastAPI's body
    reading lets it through)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body exceeds {limit} bytes")
