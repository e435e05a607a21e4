"""OTLP/JSON, the encoding of OpenTelemetry's HTTP exporters, to and from agentbolt spans: the
codec behind the store server's OTLP ingest (:mod:`agentbolt.store.server.otlp`) and
``agentbolt export --format otlp``. Importing it is cheap (no FastAPI)."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import ValidationError

from ... import semconv
from ... import types as t
from ...errors import SchemaError
from ...spans import rollout_route
from ...types import AttributeValue, Span, SpanEvent, SpanKind, SpanLink, SpanStatus, StatusCode

__all__ = ["span_to_otlp_json", "spans_from_otlp_json", "spans_to_otlp_json"]


_OTLP_KIND = {SpanKind.INTERNAL: 1, SpanKind.SERVER: 2, SpanKind.CLIENT: 3, SpanKind.PRODUCER: 4, SpanKind.CONSUMER: 5}
_OTLP_KIND_BACK = {v: k for k, v in _OTLP_KIND.items()} | {0: SpanKind.INTERNAL}
_OTLP_KIND_NAMES = {f"SPAN_KIND_{k.value}": k for k in SpanKind} | {"SPAN_KIND_UNSPECIFIED": SpanKind.INTERNAL}
_OTLP_STATUS = {StatusCode.UNSET: 0, StatusCode.OK: 1, StatusCode.ERROR: 2}
_OTLP_STATUS_BACK = {v: k for k, v in _OTLP_STATUS.items()}
_OTLP_STATUS_NAMES = {f"STATUS_CODE_{k.value}": k for k in StatusCode}


def _otlp_any(value: AttributeValue) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, str):
        return {"stringValue": value}
    return {"arrayValue": {"values": [_otlp_any(v) for v in value]}}


def _otlp_attributes(attrs: Mapping[str, AttributeValue]) -> list[dict[str, Any]]:
    return [{"key": k, "value": _otlp_any(v)} for k, v in attrs.items()]


def _from_otlp_any(value: Mapping[str, Any]) -> Any:
    if "stringValue" in value:
        return value["stringValue"]
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "intValue" in value:
        return int(value["intValue"])
    if "doubleValue" in value:
        return float(value["doubleValue"])
    if "arrayValue" in value:
        return [_from_otlp_any(v) for v in value["arrayValue"].get("values", [])]
    if "kvlistValue" in value:  # not an OTel attribute type we store natively: keep it as JSON
        kv = {x["key"]: _from_otlp_any(x.get("value", {})) for x in value["kvlistValue"].get("values", [])}
        return json.dumps(kv, sort_keys=True)
    if "bytesValue" in value:
        return str(value["bytesValue"])
    if not value:
        return ""
    raise SchemaError(f"unsupported OTLP attribute value {value!r}")


def _from_otlp_attributes(attrs: Iterable[Mapping[str, Any]] | None) -> dict[str, AttributeValue]:
    return {a["key"]: _from_otlp_any(a.get("value", {})) for a in attrs or ()}


def _otlp_id(value: Any, length: int) -> str:
    """OTLP/JSON ids are hex; some exporters send base64 (protobuf's default JSON mapping)."""
    s = str(value or "")
    if len(s) == length:
        return s.lower()

    try:
        raw = base64.b64decode(s, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise SchemaError(f"invalid OTLP id {s!r}: expected {length} hex characters") from exc
    return raw.hex()


def _otlp_enum(value: Any, by_int: Mapping[int, Any], by_name: Mapping[str, Any], what: str) -> Any:
    if isinstance(value, str) and value in by_name:
        return by_name[value]
    try:
        return by_int[int(value)]
    except (KeyError, ValueError, TypeError) as exc:
        raise SchemaError(f"invalid OTLP {what}: {value!r}") from exc


def spans_to_otlp_json(spans: Iterable[Span]) -> dict[str, Any]:
    """Encode spans as an OTLP/JSON ``ExportTraceServiceRequest``.

    Spans are grouped into ``resourceSpans`` by (resource, rollout, attempt); the rollout and
    attempt ids travel as the resource attributes ``agentbolt.rollout_id`` / ``attempt_id``.
    """
    groups: dict[str, tuple[dict[str, AttributeValue], dict[str | None, list[Span]]]] = {}
    for span in spans:
        resource = dict(span.resource)
        if span.rollout_id is not None:
            resource[semconv.ROLLOUT_ID] = span.rollout_id
        if span.attempt_id is not None:
            resource[semconv.ATTEMPT_ID] = span.attempt_id
        key = json.dumps(resource, sort_keys=True)
        scopes = groups.setdefault(key, (resource, {}))[1]
        scopes.setdefault(span.scope, []).append(span)
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": _otlp_attributes(resource)},
                "scopeSpans": [
                    {"scope": {"name": scope or ""}, "spans": [span_to_otlp_json(s) for s in members]}
                    for scope, members in scopes.items()
                ],
            }
            for resource, scopes in groups.values()
        ]
    }


def spans_from_otlp_json(
    payload: Mapping[str, Any],
    *,
    rollout_id: str | None = None,
    attempt_id: str | None = None,
) -> list[Span]:
    """Decode an OTLP/JSON ``ExportTraceServiceRequest`` into spans.

    Rollout and attempt ids come from the arguments, else from each span's attributes, else
    from its resource attributes. Raises :class:`SchemaError` on malformed input.
    """
    if not isinstance(payload, Mapping):
        raise SchemaError("OTLP payload must be a JSON object with 'resourceSpans'")
    out: list[Span] = []
    try:
        for rs in payload.get("resourceSpans") or ():
            resource = _from_otlp_attributes((rs.get("resource") or {}).get("attributes"))
            for ss in rs.get("scopeSpans") or rs.get("instrumentationLibrarySpans") or ():
                scope = (ss.get("scope") or ss.get("instrumentationLibrary") or {}).get("name") or None
                for sp in ss.get("spans") or ():
                    attributes = _from_otlp_attributes(sp.get("attributes"))
                    rid, aid = rollout_route(rollout_id, attempt_id, attributes, resource)
                    status = sp.get("status") or {}
                    parent = sp.get("parentSpanId") or None
                    end = sp.get("endTimeUnixNano")
                    out.append(
                        Span(
                            rollout_id=None if rid is None else str(rid),
                            attempt_id=None if aid is None else str(aid),
                            trace_id=_otlp_id(sp.get("traceId"), 32),
                            span_id=_otlp_id(sp.get("spanId"), 16),
                            parent_span_id=_otlp_id(parent, 16) if parent else None,
                            name=sp["name"],
                            kind=_otlp_enum(sp.get("kind", 1), _OTLP_KIND_BACK, _OTLP_KIND_NAMES, "span kind"),
                            start_time_ns=int(sp.get("startTimeUnixNano") or 0),
                            end_time_ns=int(end) if end is not None else None,
                            status=SpanStatus(
                                code=_otlp_enum(
                                    status.get("code", 0), _OTLP_STATUS_BACK, _OTLP_STATUS_NAMES, "status code"
                                ),
                                message=status.get("message") or "",
                            ),
                            attributes=attributes,
                            events=[
                                SpanEvent(
                                    name=e["name"],
                                    time_ns=int(e.get("timeUnixNano") or 0),
                                    attributes=_from_otlp_attributes(e.get("attributes")),
                                )
                                for e in sp.get("events") or ()
                            ],
                            links=[
                                SpanLink(
                                    trace_id=_otlp_id(x.get("traceId"), 32),
                                    span_id=_otlp_id(x.get("spanId"), 16),
                                    attributes=_from_otlp_attributes(x.get("attributes")),
                                )
                                for x in sp.get("links") or ()
                            ],
                            resource=resource,
                            scope=scope,
                        )
                    )
    except SchemaError:
        raise
    except (ValidationError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise SchemaError(f"malformed OTLP/JSON trace payload: {exc}") from exc
    return out


def span_to_otlp_json(span: t.Span) -> dict[str, Any]:
    """A span in the OTLP/JSON encoding (one element of ``scopeSpans[].spans``)."""
    out: dict[str, Any] = {
        "traceId": span.trace_id,
        "spanId": span.span_id,
        "name": span.name,
        "kind": _OTLP_KIND[span.kind],
        "startTimeUnixNano": str(span.start_time_ns),
        "attributes": _otlp_attributes(span.attributes),
        "status": {"code": _OTLP_STATUS[span.status.code], "message": span.status.message},
    }
    if span.parent_span_id:
        out["parentSpanId"] = span.parent_span_id
    if span.end_time_ns is not None:
        out["endTimeUnixNano"] = str(span.end_time_ns)
    if span.events:
        out["events"] = [
            {
                "name": e.name,
                "timeUnixNano": str(e.time_ns),
                "attributes": _otlp_attributes(e.attributes),
            }
            for e in span.events
        ]
    if span.links:
        out["links"] = [
            {"traceId": x.trace_id, "spanId": x.span_id, "attributes": _otlp_attributes(x.attributes)}
            for x in span.links
        ]
    return out
