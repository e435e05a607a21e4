"""OpenLLMetry's spans as agentbolt units (the mapping: see :mod:`agentbolt_openllmetry.adapter`)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from opentelemetry.semconv_ai import SpanAttributes, TraceloopSpanKindValues

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.capture.adapters import OtelSpanHooks, UnitRecord, call_arguments, first_attribute, text_attribute

__all__ = ["OpenLLMetryHooks"]

_MAX_TEXT = 16 * 1024
_LLM_OPERATIONS = {
    semconv.OP_CHAT: semconv.OP_CHAT,
    semconv.OP_TEXT_COMPLETION: semconv.OP_TEXT_COMPLETION,
    semconv.OP_GENERATE_CONTENT: semconv.OP_GENERATE_CONTENT,
    "chat": semconv.OP_CHAT,  # llm.request.type, before the GenAI operation names
    "completion": semconv.OP_TEXT_COMPLETION,
}
_PROMPT_FIELD = re.compile(r"^gen_ai\.prompt\.(\d+)\.(\w+)$")
_INSTRUMENTATION_SCOPES = ("opentelemetry.instrumentation.", "traceloop.")
"""Tracer names of OpenLLMetry's instrumentations and of the Traceloop SDK."""


class OpenLLMetryHooks(OtelSpanHooks):
    """Maps OpenLLMetry's spans; leaves every other span alone."""

    def map_span(self, span: t.Span) -> UnitRecord | None:
        kind = span.attributes.get(SpanAttributes.TRACELOOP_SPAN_KIND)
        if kind == TraceloopSpanKindValues.AGENT.value:
            name = first_attribute(span, semconv.GEN_AI_AGENT_NAME, SpanAttributes.TRACELOOP_ENTITY_NAME)
            return UnitRecord(semconv.KIND_AGENT, "", {semconv.GEN_AI_AGENT_NAME: name})
        if kind == TraceloopSpanKindValues.TOOL.value:
            return UnitRecord(semconv.KIND_TOOL, "", _tool_attributes(span))
        if isinstance(kind, str) and kind:  # workflow, task, unknown
            return UnitRecord(
                semconv.KIND_OPERATION,
                "",
                {semconv.OPERATION_NAME: first_attribute(span, SpanAttributes.TRACELOOP_ENTITY_NAME) or span.name},
            )
        if not (span.scope or "").startswith(_INSTRUMENTATION_SCOPES):
            return None
        operation = first_attribute(span, semconv.GEN_AI_OPERATION_NAME, SpanAttributes.LLM_REQUEST_TYPE)
        if operation in _LLM_OPERATIONS:
            attrs: dict[str, Any] = {semconv.GEN_AI_OPERATION_NAME: _LLM_OPERATIONS[operation]}
            if semconv.GEN_AI_INPUT_MESSAGES not in span.attributes and (prompt := _legacy_prompt(span.attributes)):
                attrs[semconv.GEN_AI_INPUT_MESSAGES] = json.dumps(prompt)
            return UnitRecord(semconv.KIND_LLM, "", attrs)
        return None


def _legacy_prompt(attrs: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The request's messages from OpenLLMetry's flattened ``gen_ai.prompt.{i}.role`` /
    ``.content`` (what it records up to the GenAI conventions' ``gen_ai.input.messages``), read so
    LightningRL can join the span to its gateway call by the request's fingerprint."""
    messages: dict[int, dict[str, Any]] = {}
    for key, value in attrs.items():
        match = _PROMPT_FIELD.match(key)
        if match is not None and match.group(2) in ("role", "content", "tool_call_id"):
            messages.setdefault(int(match.group(1)), {})[match.group(2)] = value
    return [messages[i] for i in sorted(messages)]


def _tool_attributes(span: t.Span) -> dict[str, Any]:
    attrs = span.attributes
    return {
        semconv.GEN_AI_TOOL_NAME: first_attribute(span, semconv.GEN_AI_TOOL_NAME, SpanAttributes.TRACELOOP_ENTITY_NAME),
        semconv.GEN_AI_TOOL_CALL_ARGUMENTS: text_attribute(
            call_arguments(attrs.get(SpanAttributes.TRACELOOP_ENTITY_INPUT)), _MAX_TEXT
        ),
        semconv.GEN_AI_TOOL_CALL_RESULT: text_attribute(attrs.get(SpanAttributes.TRACELOOP_ENTITY_OUTPUT), _MAX_TEXT),
    }
