"""The HTTP routes ``agentbolt serve`` adds to the gateway's port, and their OpenAPI items.

- ``POST /v1/feedback``: a :class:`~agentbolt.online.feedback.Feedback` body; 200 with a
  :class:`~agentbolt.online.feedback.FeedbackResult`, 404 for an unknown session or response,
  409 for a feedback id reused with other content or for another session or response (the
  message names the first use), 422 for a malformed body or a refused reward (not a number, not
  finite, beyond 1e15 in magnitude, outside the serve config's ``reward_range``).
- ``POST /v1/sessions/close``: ``{"session_id": ...}``: close a session now (it becomes
  trainable once rewarded) instead of waiting for its idle window.
- ``GET /v1/online/status``: the live version, sessions, feedback and judge counters (the run's,
  rebuilt from the store on start), the latest gate decisions.

``GET /ready`` (the gateway's, no token) answers 200 once the live policy serves, 503 before.

All of them sit behind the gateway's token (``Authorization: Bearer``) and Host checks.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..gateway import control
from ..gateway.http import Request
from ..gateway.routing import ExtraRoute
from .feedback import Feedback, FeedbackConflict, FeedbackResult, RewardRefused, UnknownTarget

__all__ = ["CloseSession", "online_openapi_paths", "online_routes"]

log = logging.getLogger(__name__)

_JSON = [("content-type", "application/json")]

Reply = tuple[int, bytes, list[tuple[str, str]]]
"""An answer: status, body, headers."""

M = TypeVar("M", bound=BaseModel)


class CloseSession(BaseModel):
    """``POST /v1/sessions/close``: close a session now."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    session_id: Annotated[str, Field(min_length=1, max_length=256)]
    """The session to close."""


def _error(status: int, message: str, type_: str = "invalid_request_error") -> Reply:
    return status, orjson.dumps({"error": {"message": message, "type": type_, "code": None}}), _JSON


def _posted(request: Request, model: type[M]) -> M | Reply:
    """The request's JSON body as ``model``, else the answer refusing it (405, 415 or 422)."""
    if request.method != "POST":
        return _error(405, f"{request.path} takes POST")
    if not control.is_json(request.headers.get("content-type")):
        return _error(415, "send the body as JSON with 'Content-Type: application/json'")
    try:
        return model.model_validate_json(request.body)
    except ValidationError as exc:
        return _error(422, control.validation_message(exc))


Handler = Callable[[Request], Awaitable[Reply]]


def online_routes(server: Any) -> dict[str, ExtraRoute]:
    """The routes of an :class:`~agentbolt.online.serve.OnlineServer` (``server``)."""

    async def feedback(request: Request) -> Reply:
        body = _posted(request, Feedback)
        if not isinstance(body, Feedback):
            return body
        try:
            result = await server.record_feedback(body)
        except UnknownTarget as exc:
            return _error(404, str(exc), "agentbolt_unknown_session")
        except FeedbackConflict as exc:
            return _error(409, str(exc), "agentbolt_feedback_conflict")
        except RewardRefused as exc:  # outside the serve config's reward_range
            return _error(422, str(exc), "agentbolt_reward_refused")
        except Exception as exc:  # the store failed: nothing was recorded, the client may retry
            log.warning("feedback %s not recorded: %s", body.feedback_id, exc)
            return _error(503, f"the store could not record the feedback ({exc}); retry", "agentbolt_store_error")
        return 200, result.model_dump_json().encode(), _JSON

    async def close_session(request: Request) -> Reply:
        body = _posted(request, CloseSession)
        if not isinstance(body, CloseSession):
            return body
        if not await server.sessions.close(body.session_id):
            return _error(404, f"unknown session {body.session_id!r}", "agentbolt_unknown_session")
        return 200, orjson.dumps({"session_id": body.session_id, "closed": True}), _JSON

    async def status(request: Request) -> Reply:
        if request.method != "GET":
            return _error(405, f"{request.path} takes GET")
        return 200, orjson.dumps(server.status()), _JSON

    return {"/v1/feedback": feedback, "/v1/sessions/close": close_session, "/v1/online/status": status}


def _schema_ref(model: type[BaseModel]) -> dict[str, Any]:
    schema = model.model_json_schema()
    schema.pop("title", None)
    return schema


def online_openapi_paths() -> dict[str, Any]:
    """OpenAPI path items of :func:`online_routes` (added to the gateway's document)."""
    error = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}

    def errors(*codes: int) -> dict[str, Any]:
        text = {
            401: "Missing or wrong bearer token.",
            404: "Unknown session or response.",
            409: "The feedback id was used before (in this run) with other content or another target.",
            415: "The body is not JSON.",
            421: "A Host the server does not answer.",
            422: "The body does not match the schema, or the reward is refused (outside reward_range).",
            503: "The store could not record it; retry.",
        }
        return {str(c): {"description": text[c], "content": error} for c in codes}

    def body(model: type[BaseModel]) -> dict[str, Any]:
        return {"required": True, "content": {"application/json": {"schema": _schema_ref(model)}}}

    ok = {"application/json": {"schema": {"type": "object"}}}
    return {
        "/v1/feedback": {
            "post": {
                "operationId": "feedback",
                "summary": "Attach a reward to a session or one response (idempotent on feedback_id).",
                "requestBody": body(Feedback),
                "responses": {
                    "200": {
                        "description": "Recorded (or a duplicate).",
                        "content": {"application/json": {"schema": _schema_ref(FeedbackResult)}},
                    },
                    **errors(401, 404, 409, 415, 421, 422, 503),
                },
            }
        },
        "/v1/sessions/close": {
            "post": {
                "operationId": "close_session",
                "summary": "Close a session now.",
                "requestBody": body(CloseSession),
                "responses": {"200": {"description": "Closed.", "content": ok}, **errors(401, 404, 415, 421, 422)},
            }
        },
        "/v1/online/status": {
            "get": {
                "operationId": "online_status",
                "summary": "Live version, sessions, feedback, judge and gate counters.",
                "responses": {"200": {"description": "Status.", "content": ok}, **errors(401, 421)},
            }
        },
    }
