"""``POST /v1/traces``: OTLP/HTTP trace export into the store (the codec is :mod:`.otlp`).

Agents in any language report spans here. Spans are routed to rollouts by their attributes or
the request's headers; what cannot be stored (no rollout, unknown rollout or attempt) is
rejected through OTLP's ``partial_success`` while the rest is stored, and errors answer in the
request's own format (protobuf or JSON ``Status``).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import Request
from starlette.responses import Response

from ... import semconv
from ... import types as t
from ...errors import NotFoundError, SchemaError, StoreUnavailableError
from ...reward_validation import reward_span_problem
from .. import wire as w
from ..base import Store
from . import otlp

__all__ = ["OTLP_DOCS", "decode_export", "export_traces", "otlp_error", "summarize_rejections"]

log = logging.getLogger(__name__)

OTLP_DOCS: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": (
            "An OTLP `ExportTraceServiceRequest`, optionally `Content-Encoding: gzip`. Spans are routed by "
            "their `agentbolt.rollout_id` / `agentbolt.attempt_id` span or resource attributes, else by the "
            f"`{w.ROLLOUT_HEADER}` / `{w.ATTEMPT_HEADER}` headers. Spans without a rollout, or of unknown "
            "rollouts, are rejected through `partial_success`; the others are stored."
        ),
        "content": {
            otlp.PROTOBUF: {"schema": {"type": "string", "format": "binary"}},
            otlp.JSON: {"schema": {"type": "object", "description": "OTLP/JSON (hex or base64 ids)."}},
        },
    }
}


async def decode_export(request: Request, max_bytes: int) -> tuple[str, list[t.Span], list[str]] | Response:
    """An OTLP/HTTP export's format, spans and one reason per span already rejected; or the error
    response (in the request's format) for a body that cannot be read as a whole."""
    try:
        fmt = otlp.request_format(request.headers.get("content-type"))
    except otlp.OtlpRequestError as exc:
        return otlp_error(otlp.JSON, exc.status, str(exc))
    try:
        body = otlp.decompress(await request.body(), request.headers.get("content-encoding"), max_bytes)
        spans, rejected = otlp.decode_spans(body, fmt)
    except otlp.OtlpRequestError as exc:
        return otlp_error(fmt, exc.status, str(exc))
    except SchemaError as exc:  # the body as a whole is malformed
        return otlp_error(fmt, 400, str(exc))
    return fmt, spans, rejected


async def export_traces(request: Request, store: Store, max_bytes: int) -> Response:
    """Store the spans of an OTLP/HTTP export; answer in the request's format, with the spans
    that could not be stored counted (and their reasons summarized) in ``partial_success``."""
    decoded = await decode_export(request, max_bytes)
    if isinstance(decoded, Response):
        return decoded
    fmt, spans, rejected = decoded
    spans = otlp.fill_ids(spans, request.headers.get(w.ROLLOUT_HEADER), request.headers.get(w.ATTEMPT_HEADER))
    refused = [(s, why) for s in spans if (why := reward_span_problem(s.name, s.attributes)) is not None]
    if refused:  # a reward that is not a finite number within 1e15 never reaches the store
        rejected.extend(why for _, why in refused)
        bad = {id(s) for s, _ in refused}
        spans = [s for s in spans if id(s) not in bad]
    missing = [s for s in spans if not s.rollout_id]
    if missing:
        rejected.extend(
            [
                f"no rollout id: set the {semconv.ROLLOUT_ID} resource or span attribute, "
                f"or the {w.ROLLOUT_HEADER} header"
            ]
            * len(missing)
        )
    try:
        rejected.extend(await _store_spans(store, [s for s in spans if s.rollout_id]))
    except StoreUnavailableError as exc:
        return otlp_error(fmt, 503, str(exc))
    message = summarize_rejections(rejected)
    if rejected:
        log.info("OTLP export: %d spans rejected: %s", len(rejected), message)
    return Response(otlp.encode_response(fmt, len(rejected), message), media_type=fmt)


async def _store_spans(store: Store, spans: list[t.Span]) -> list[str]:
    """Store what can be stored; one rejection reason per span that could not."""
    if not spans:
        return []
    try:
        await store.add_spans(spans)
        return []
    except NotFoundError:
        pass
    # Some rollout or attempt is unknown, and a batch is all or nothing: store per attempt.
    groups: dict[tuple[str | None, str | None], list[t.Span]] = {}
    for span in spans:
        groups.setdefault((span.rollout_id, span.attempt_id), []).append(span)
    rejected: list[str] = []
    for group in groups.values():
        try:
            await store.add_spans(group)
        except NotFoundError as exc:
            rejected.extend([str(exc)] * len(group))
    return rejected


def summarize_rejections(reasons: list[str], limit: int = 5) -> str:
    """``partial_success.error_message``: the distinct reasons with their counts, the first ``limit``."""
    counts: dict[str, int] = {}
    for reason in reasons:
        counts[reason] = counts.get(reason, 0) + 1
    parts = [f"{n} x {reason}" if n > 1 else reason for reason, n in list(counts.items())[:limit]]
    if len(counts) > limit:
        parts.append(f"and {len(counts) - limit} more reasons")
    return "; ".join(parts)


def otlp_error(fmt: str, status: int, message: str) -> Response:
    code = {413: otlp.RESOURCE_EXHAUSTED, 503: otlp.UNAVAILABLE}.get(status, otlp.INVALID_ARGUMENT)
    type_ = {413: "RequestTooLarge", 415: "UnsupportedMediaType", 503: "StoreUnavailableError"}.get(
        status, "SchemaError"
    )
    return Response(otlp.encode_status(fmt, code, message, type_), status_code=status, media_type=fmt)
