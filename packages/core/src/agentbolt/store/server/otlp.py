"""OTLP/HTTP trace ingest: decode ``ExportTraceServiceRequest`` bodies into spans.

Both encodings of the OTLP/HTTP specification are accepted: binary protobuf
(``application/x-protobuf``) and JSON (``application/json``, hex or base64 ids), optionally
gzip-compressed. Rollout and attempt ids come from each span's ``agentbolt.rollout_id`` /
``agentbolt.attempt_id`` attributes, else from its resource attributes, else from the
``X-Agentbolt-Rollout-Id`` / ``X-Agentbolt-Attempt-Id`` request headers.

A span that cannot be decoded is rejected alone (reported through ``partial_success``); a
body that cannot be decoded at all is refused with a ``google.rpc.Status`` body, as the
specification asks.
"""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from pydantic import ValidationError

from ... import semconv
from ... import types as t
from ...errors import SchemaError
from .otlp_json import spans_from_otlp_json

__all__ = [
    "JSON",
    "PROTOBUF",
    "OtlpRequestError",
    "decode_request",
    "decode_spans",
    "decompress",
    "encode_response",
    "encode_status",
    "fill_ids",
    "request_format",
]

PROTOBUF = "application/x-protobuf"
JSON = "application/json"

# google.rpc.Code values used in error bodies.
INVALID_ARGUMENT = 3
RESOURCE_EXHAUSTED = 8
INTERNAL = 13
UNAVAILABLE = 14
UNAUTHENTICATED = 16

_KINDS = {0: t.SpanKind.INTERNAL, 1: t.SpanKind.INTERNAL, 2: t.SpanKind.SERVER, 3: t.SpanKind.CLIENT}
_KINDS |= {4: t.SpanKind.PRODUCER, 5: t.SpanKind.CONSUMER}
_STATUS = {0: t.StatusCode.UNSET, 1: t.StatusCode.OK, 2: t.StatusCode.ERROR}
_PRIMITIVE_FIELDS = frozenset({"string_value", "bool_value", "int_value", "double_value"})


class OtlpRequestError(Exception):
    """The request as a whole cannot be accepted; ``status`` is the HTTP status to answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def request_format(content_type: str | None) -> str:
    """:data:`PROTOBUF` or :data:`JSON` for a ``Content-Type`` header; 415 otherwise."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media in ("application/x-protobuf", "application/protobuf"):
        return PROTOBUF
    if media == "application/json":
        return JSON
    raise OtlpRequestError(
        415,
        f"unsupported Content-Type {content_type!r}; OTLP/HTTP bodies are application/x-protobuf or application/json",
    )


def decompress(body: bytes, content_encoding: str | None, max_bytes: int) -> bytes:
    """The body after ``Content-Encoding`` (``gzip`` or none), refusing more than ``max_bytes``."""
    encoding = (content_encoding or "identity").strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding != "gzip":
        raise OtlpRequestError(415, f"unsupported Content-Encoding {content_encoding!r}; use gzip or none")
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = inflater.decompress(body, max_bytes + 1)
    except zlib.error as exc:
        raise OtlpRequestError(400, f"invalid gzip body: {exc}") from None
    if len(out) > max_bytes:
        raise OtlpRequestError(413, f"decompressed body exceeds the server's limit of {max_bytes} bytes")
    if not inflater.eof:
        raise OtlpRequestError(400, "invalid gzip body: truncated")
    return out


def decode_spans(body: bytes, fmt: str) -> tuple[list[t.Span], list[str]]:
    """Decode a request body; returns the spans and one reason per span that was rejected.

    Raises :class:`~agentbolt.errors.SchemaError` when the body as a whole is malformed.
    """
    if fmt == PROTOBUF:
        return _decode_protobuf(body)
    return _decode_json(body)


def fill_ids(spans: Sequence[t.Span], rollout_id: str | None, attempt_id: str | None) -> list[t.Span]:
    """Give spans without a rollout id the request's default ids (from headers).

    The default attempt id also goes to spans that name the default rollout but no attempt.
    """
    if rollout_id is None:
        return list(spans)
    out = []
    for span in spans:
        if span.rollout_id is None:
            span = span.model_copy(update={"rollout_id": rollout_id, "attempt_id": span.attempt_id or attempt_id})
        elif span.rollout_id == rollout_id and span.attempt_id is None and attempt_id is not None:
            span = span.model_copy(update={"attempt_id": attempt_id})
        out.append(span)
    return out


def encode_response(fmt: str, rejected: int, message: str) -> bytes:
    """An ``ExportTraceServiceResponse``; ``partial_success`` is set only when spans were rejected."""
    if fmt == PROTOBUF:
        response = ExportTraceServiceResponse()
        if rejected:
            response.partial_success.rejected_spans = rejected
            response.partial_success.error_message = message
        return response.SerializeToString()
    if not rejected:
        return b"{}"
    return orjson.dumps({"partialSuccess": {"rejectedSpans": str(rejected), "errorMessage": message}})


def encode_status(fmt: str, code: int, message: str, error_type: str) -> bytes:
    """A ``google.rpc.Status`` error body (JSON bodies also carry agentbolt's ``error`` object)."""
    if fmt == PROTOBUF:
        text = message.encode()
        return b"\x08" + _varint(code) + b"\x12" + _varint(len(text)) + text
    return orjson.dumps({"code": code, "message": message, "error": {"type": error_type, "message": message}})


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


# -- protobuf -------------------------------------------------------------------------------------


def _decode_protobuf(body: bytes) -> tuple[list[t.Span], list[str]]:
    try:
        request = ExportTraceServiceRequest.FromString(body)
    except DecodeError as exc:
        raise SchemaError(f"body is not a protobuf ExportTraceServiceRequest: {exc}") from None
    return decode_request(request)


def decode_request(request: ExportTraceServiceRequest) -> tuple[list[t.Span], list[str]]:
    """The spans of a parsed ``ExportTraceServiceRequest`` (what an OTLP/gRPC server receives),
    and one reason per span that was rejected."""
    spans: list[t.Span] = []
    rejected: list[str] = []
    for rs in request.resource_spans:
        try:
            resource = _pb_attributes(rs.resource.attributes)
        except (SchemaError, ValueError) as exc:
            n = sum(len(ss.spans) for ss in rs.scope_spans)
            rejected.extend([f"invalid resource attributes: {exc}"] * n)
            continue
        for ss in rs.scope_spans:
            scope = ss.scope.name or None
            for sp in ss.spans:
                try:
                    spans.append(_pb_span(sp, resource, scope))
                except (ValidationError, SchemaError, ValueError, KeyError) as exc:
                    rejected.append(f"span {sp.name!r}: {_short(exc)}")
    return spans, rejected


def _pb_span(sp: Any, resource: dict[str, Any], scope: str | None) -> t.Span:
    attributes = _pb_attributes(sp.attributes)
    rid = attributes.get(semconv.ROLLOUT_ID) or resource.get(semconv.ROLLOUT_ID)
    aid = attributes.get(semconv.ATTEMPT_ID) or resource.get(semconv.ATTEMPT_ID)
    if sp.kind not in _KINDS:
        raise SchemaError(f"invalid span kind {sp.kind}")
    if sp.status.code not in _STATUS:
        raise SchemaError(f"invalid status code {sp.status.code}")
    return t.Span(
        rollout_id=None if rid is None else str(rid),
        attempt_id=None if aid is None else str(aid),
        trace_id=sp.trace_id.hex(),
        span_id=sp.span_id.hex(),
        parent_span_id=sp.parent_span_id.hex() or None,
        name=sp.name,
        kind=_KINDS[sp.kind],
        start_time_ns=sp.start_time_unix_nano,
        end_time_ns=sp.end_time_unix_nano or None,
        status=t.SpanStatus(code=_STATUS[sp.status.code], message=sp.status.message),
        attributes=attributes,
        events=[
            t.SpanEvent(name=e.name, time_ns=e.time_unix_nano, attributes=_pb_attributes(e.attributes))
            for e in sp.events
        ],
        links=[
            t.SpanLink(trace_id=x.trace_id.hex(), span_id=x.span_id.hex(), attributes=_pb_attributes(x.attributes))
            for x in sp.links
        ],
        resource=resource,
        scope=scope,
    )


def _pb_attributes(attributes: Iterable[Any]) -> dict[str, Any]:
    return {kv.key: _pb_value(kv.value) for kv in attributes}


def _pb_value(value: Any) -> Any:
    """An ``AnyValue`` as agentbolt stores it (the same as the OTLP/JSON decoder does)."""
    kind = value.WhichOneof("value")
    if kind in _PRIMITIVE_FIELDS:
        return getattr(value, kind)
    if kind == "array_value":
        return [_pb_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":  # not an attribute type we store natively: keep it as JSON
        return json.dumps({kv.key: _pb_value(kv.value) for kv in value.kvlist_value.values}, sort_keys=True)
    if kind == "bytes_value":  # as base64, like protobuf's JSON mapping
        return base64.b64encode(value.bytes_value).decode()
    return ""


# -- JSON -----------------------------------------------------------------------------------------


def _decode_json(body: bytes) -> tuple[list[t.Span], list[str]]:
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise SchemaError(f"body is not valid JSON: {exc}") from None
    if not isinstance(payload, Mapping):
        raise SchemaError("OTLP/JSON body must be an object with 'resourceSpans'")
    try:
        return spans_from_otlp_json(payload), []
    except SchemaError:
        pass
    # Some span is malformed: decode one span at a time to keep the others.
    spans: list[t.Span] = []
    rejected: list[str] = []
    try:
        for rs in payload.get("resourceSpans") or ():
            for ss in rs.get("scopeSpans") or rs.get("instrumentationLibrarySpans") or ():
                scope = ss.get("scope") or ss.get("instrumentationLibrary") or {}
                for sp in ss.get("spans") or ():
                    one = {
                        "resourceSpans": [
                            {"resource": rs.get("resource") or {}, "scopeSpans": [{"scope": scope, "spans": [sp]}]}
                        ]
                    }
                    try:
                        spans.extend(spans_from_otlp_json(one))
                    except SchemaError as exc:
                        name = sp.get("name") if isinstance(sp, Mapping) else None
                        rejected.append(f"span {name!r}: {_short(exc)}")
    except (AttributeError, TypeError) as exc:
        raise SchemaError(f"malformed OTLP/JSON trace payload: {exc}") from None
    return spans, rejected


def _short(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
