"""OpenInference's spans as agentbolt units (the mapping: see :mod:`agentbolt_openinference.adapter`)."""

from __future__ import annotations

import collections
import json
import re
import threading
from collections.abc import Mapping
from typing import Any

from openinference.semconv.trace import (
    MessageAttributes,
    MessageContentAttributes,
    OpenInferenceSpanKindValues,
    SpanAttributes,
    ToolCallAttributes,
)

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.capture.adapters import (
    OtelSpanHooks,
    UnitRecord,
    call_arguments,
    first_attribute,
    text_attribute,
    tool_call,
)

__all__ = ["OpenInferenceHooks"]

_KINDS = {
    OpenInferenceSpanKindValues.AGENT.value: semconv.KIND_AGENT,
    OpenInferenceSpanKindValues.LLM.value: semconv.KIND_LLM,
    OpenInferenceSpanKindValues.TOOL.value: semconv.KIND_TOOL,
}
_RUN_SUFFIX = ".run"
"""smolagents' OpenInference instrumentor names an agent's span ``{agent name}.run``."""
_MAX_TEXT = 16 * 1024
_OUTPUT_PREFIX = SpanAttributes.LLM_OUTPUT_MESSAGES + "."
_INPUT_PREFIX = SpanAttributes.LLM_INPUT_MESSAGES + "."
_LLAMA_INDEX_AGENT_STEP = ".run_agent_step"
"""LlamaIndex's agent step (``BaseWorkflowAgent.run_agent_step``): one turn of one agent, enclosing its LLM calls."""
_CURRENT_AGENT = re.compile(r"current_agent_name=['\"]([^'\"]+)['\"]|\"current_agent_name\":\s*\"([^\"]+)\"")
"""The agent a LlamaIndex workflow event names (``AgentSetup(..., current_agent_name='calculator')``)."""
_MESSAGE_FIELD = re.compile(r"^(\d+)\.message\.(.+)$")
_CONTENT_TEXT = re.compile(
    rf"^{re.escape(MessageAttributes.MESSAGE_CONTENTS)}\.(\d+)\.{re.escape(MessageContentAttributes.MESSAGE_CONTENT_TEXT)}$"
)
_TOOL_CALL_FIELD = re.compile(rf"^{re.escape(MessageAttributes.MESSAGE_TOOL_CALLS)}\.(\d+)\.(.+)$")
_MAX_OPEN = 65_536
"""Spans whose agent is remembered while they run (a span that never ends is forgotten past this)."""
_REPR_ID = re.compile(r"^\w+\(id='([^']+)'")
"""The response id at the head of a pydantic repr (``ChatCompletion(id='chatcmpl-…', …)``)."""


class OpenInferenceHooks(OtelSpanHooks):
    """Maps spans that carry ``openinference.span.kind``; leaves every other span alone.

    LLM spans also get ``gen_ai.agent.name`` of their agent when they start: an instrumentor may
    never end an agent's span (smolagents' leaves it open when the run raises), and LightningRL
    then still knows whose calls they were.
    """

    def __init__(self, adapter: str) -> None:
        super().__init__(adapter)
        self._agents: collections.OrderedDict[int, str | Any] = collections.OrderedDict()
        """Open span id -> name of the agent it runs in, or the agent's span itself: its name is
        read when a call starts under it (CrewAI sets the agent's role after the span starts)."""
        self._agents_lock = threading.Lock()

    def on_span_start(self, span: Any) -> None:
        attrs = span.attributes or {}
        kind = attrs.get(SpanAttributes.OPENINFERENCE_SPAN_KIND)
        if not isinstance(kind, str):
            return
        parent = span.parent.span_id if span.parent is not None else None
        with self._agents_lock:
            entry: str | Any | None
            if kind.upper() == OpenInferenceSpanKindValues.AGENT.value:
                entry = span  # its name is read when a call starts under it
            elif (step := _llama_index_agent(attrs, span.name)) is not None:
                entry = step
            else:
                entry = self._agents.get(parent) if parent is not None else None
            if entry is not None:
                self._agents[span.get_span_context().span_id] = entry
                while len(self._agents) > _MAX_OPEN:
                    self._agents.popitem(last=False)
        name = entry if entry is None or isinstance(entry, str) else _agent_name(entry.attributes or {}, entry.name)
        if name and kind.upper() == OpenInferenceSpanKindValues.LLM.value and not attrs.get(semconv.GEN_AI_AGENT_NAME):
            span.set_attribute(semconv.GEN_AI_AGENT_NAME, name)

    def map_span(self, span: t.Span) -> UnitRecord | None:
        kind = span.attributes.get(SpanAttributes.OPENINFERENCE_SPAN_KIND)
        if not isinstance(kind, str) or not kind:
            return None
        with self._agents_lock:
            self._agents.pop(int(span.span_id, 16), None)  # it ended
        kind = kind.upper()
        if kind == OpenInferenceSpanKindValues.AGENT.value:
            return UnitRecord(semconv.KIND_AGENT, "", _agent_attributes(span))
        if kind == OpenInferenceSpanKindValues.LLM.value:
            return UnitRecord(semconv.KIND_LLM, "", _llm_attributes(span))
        if kind == OpenInferenceSpanKindValues.TOOL.value:
            return UnitRecord(semconv.KIND_TOOL, "", _tool_attributes(span))
        if (agent := _llama_index_agent(span.attributes, span.name)) is not None:
            return UnitRecord(semconv.KIND_AGENT, "", {semconv.GEN_AI_AGENT_NAME: agent})
        return UnitRecord(semconv.KIND_OPERATION, "", {semconv.OPERATION_NAME: span.name})


def _llama_index_agent(attrs: Mapping[str, Any], span_name: str) -> str | None:
    """LlamaIndex (llama-index-core 0.14): the instrumentor marks no span AGENT (its AGENT rule
    targets a base class 0.14 no longer has), but each agent turn runs in a CHAIN span
    ``BaseWorkflowAgent.run_agent_step`` whose input event names the agent
    (``AgentSetup(..., current_agent_name='calculator')``, the ``name`` given to ``FunctionAgent``):
    that span is the agent's span. ``None`` for any other span."""
    if not span_name.endswith(_LLAMA_INDEX_AGENT_STEP):
        return None
    value = attrs.get(SpanAttributes.INPUT_VALUE)
    match = _CURRENT_AGENT.search(value) if isinstance(value, str) else None
    if match is None:
        return None
    return match.group(1) or match.group(2) or None


def _agent_attributes(span: t.Span) -> dict[str, Any]:
    return {semconv.GEN_AI_AGENT_NAME: _agent_name(span.attributes, span.name)}


_PYDANTIC_AI_AGENT_NAME = "agent_name"
"""pydantic-ai's attribute for its agent's name on the run span (instrumentation versions 1 and 2)."""


def _agent_name(attrs: Mapping[str, Any], span_name: str) -> str | None:
    """``agent.name``; else the framework's own name of the agent where OpenInference gives none:
    ``gen_ai.agent.name`` / ``agent_name`` (pydantic-ai's run span, ``invoke_agent`` / ``agent
    run``, under OpenInference's span processor), ``graph.node.id`` (CrewAI's agent spans: the
    agent's role; their names are ``{role}.{task}._execute_core``); else the span's name (without
    smolagents' ``.run``)."""
    for key in (
        SpanAttributes.AGENT_NAME,
        semconv.GEN_AI_AGENT_NAME,
        _PYDANTIC_AI_AGENT_NAME,
        SpanAttributes.GRAPH_NODE_ID,
    ):
        name = attrs.get(key)
        if isinstance(name, str) and name:
            return name
    return span_name.removesuffix(_RUN_SUFFIX) or None


def _llm_attributes(span: t.Span) -> dict[str, Any]:
    attrs = span.attributes
    model = first_attribute(span, SpanAttributes.LLM_RESPONSE_MODEL_NAME, SpanAttributes.LLM_MODEL_NAME)
    messages = _messages(attrs, _OUTPUT_PREFIX)
    inputs = _messages(attrs, _INPUT_PREFIX)
    return {
        semconv.GEN_AI_INPUT_MESSAGES: json.dumps(inputs) if inputs else None,
        semconv.GEN_AI_REQUEST_MODEL: first_attribute(span, SpanAttributes.LLM_REQUEST_MODEL_NAME) or model,
        semconv.GEN_AI_RESPONSE_MODEL: model,
        semconv.GEN_AI_SYSTEM: first_attribute(span, SpanAttributes.LLM_PROVIDER, SpanAttributes.LLM_SYSTEM),
        semconv.GEN_AI_USAGE_INPUT_TOKENS: _int(attrs.get(SpanAttributes.LLM_TOKEN_COUNT_PROMPT)),
        semconv.GEN_AI_USAGE_OUTPUT_TOKENS: _int(attrs.get(SpanAttributes.LLM_TOKEN_COUNT_COMPLETION)),
        semconv.GEN_AI_OUTPUT_MESSAGES: messages or None,
        semconv.GEN_AI_RESPONSE_ID: _response_id(attrs),
    }


def _tool_span_name(name: str) -> str:
    """A tool span's name as the tool's: DSPy's instrumentation names no tool (no ``tool.name``)
    and calls its spans ``{tool}.__call__`` / ``{tool}.acall``."""
    for suffix in (".__call__", ".acall"):
        if name.endswith(suffix) and len(name) > len(suffix):
            return name.removesuffix(suffix)
    return name


def _tool_attributes(span: t.Span) -> dict[str, Any]:
    attrs = span.attributes
    return {
        semconv.GEN_AI_TOOL_NAME: first_attribute(span, SpanAttributes.TOOL_NAME) or _tool_span_name(span.name),
        semconv.GEN_AI_TOOL_DESCRIPTION: text_attribute(attrs.get(SpanAttributes.TOOL_DESCRIPTION), _MAX_TEXT),
        semconv.GEN_AI_TOOL_CALL_ID: first_attribute(span, SpanAttributes.TOOL_ID, ToolCallAttributes.TOOL_CALL_ID),
        semconv.GEN_AI_TOOL_CALL_ARGUMENTS: text_attribute(
            call_arguments(attrs.get(SpanAttributes.INPUT_VALUE)), _MAX_TEXT
        ),
        semconv.GEN_AI_TOOL_CALL_RESULT: text_attribute(attrs.get(SpanAttributes.OUTPUT_VALUE), _MAX_TEXT),
    }


def _messages(attrs: Mapping[str, Any], prefix: str) -> list[dict[str, Any]]:
    """``llm.output_messages.{i}.message.*`` or ``llm.input_messages.{i}.message.*`` (flattened,
    by ``prefix``) as OpenAI chat messages (the input ones give LightningRL the request
    fingerprint that joins a streamed call to its gateway span)."""
    messages: dict[int, dict[str, Any]] = {}
    texts: dict[int, dict[int, str]] = {}
    calls: dict[int, dict[int, dict[str, Any]]] = {}
    for key, value in attrs.items():
        if not key.startswith(prefix):
            continue
        match = _MESSAGE_FIELD.match(key[len(prefix) :])
        if match is None:
            continue
        index, field = int(match.group(1)), "message." + match.group(2)
        message = messages.setdefault(index, {})
        if field == MessageAttributes.MESSAGE_ROLE:
            message["role"] = value
        elif field == MessageAttributes.MESSAGE_CONTENT:
            message["content"] = value
        elif (text := _CONTENT_TEXT.match(field)) is not None:
            texts.setdefault(index, {})[int(text.group(1))] = str(value)
        elif field == MessageAttributes.MESSAGE_TOOL_CALL_ID:
            message["tool_call_id"] = value
        elif (call := _TOOL_CALL_FIELD.match(field)) is not None:
            calls.setdefault(index, {}).setdefault(int(call.group(1)), {})[call.group(2)] = value
    out = []
    for index in sorted(messages):
        message = messages[index]
        if "content" not in message and index in texts:
            message["content"] = "".join(texts[index][i] for i in sorted(texts[index]))
        if index in calls:
            message["tool_calls"] = [
                tool_call(
                    c.get(ToolCallAttributes.TOOL_CALL_ID),
                    c.get(ToolCallAttributes.TOOL_CALL_FUNCTION_NAME),
                    c.get(ToolCallAttributes.TOOL_CALL_FUNCTION_ARGUMENTS_JSON),
                )
                for _, c in sorted(calls[index].items())
            ]
        out.append(message)
    return out


def _response_id(attrs: Mapping[str, Any]) -> str | None:
    """The provider's response id, when the span's JSON output holds it: the response itself
    (``openinference-instrumentation-openai``: ``{"id": ...}``) or the raw response a framework
    kept (smolagents: ``{"raw": "ChatCompletion(id='…', …)"}``)."""
    value = attrs.get(SpanAttributes.OUTPUT_VALUE)
    if not isinstance(value, str) or not value.startswith("{"):
        return None
    try:
        output = json.loads(value)
    except ValueError:
        return None
    if not isinstance(output, Mapping):
        return None
    for candidate in (output.get("id"), output.get("raw")):
        if isinstance(candidate, Mapping):
            candidate = candidate.get("id")
        elif isinstance(candidate, str) and (match := _REPR_ID.match(candidate)) is not None:
            candidate = match.group(1)
        if isinstance(candidate, str) and candidate and " " not in candidate:
            return candidate
    return None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
