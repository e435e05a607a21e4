"""How LightningRL reads spans: which span is an LLM call, an agent, a tool, a reward, an exception.

Classification uses :mod:`agentbolt.semconv` only (``agentbolt.span.kind`` first, then the
OpenTelemetry GenAI ``gen_ai.operation.name``, then agentbolt's own span names), never
framework-specific heuristics or timestamps. Adapters and plain OpenTelemetry GenAI
instrumentation both fit these rules.

Two kinds of LLM span exist:

- a **gateway call** (written by agentbolt's gateway): carries token data
  (``agentbolt.llm.token_source`` / token id attributes) or is named ``agentbolt.llm``;
- a **framework LLM span** (written by an adapter or GenAI instrumentation): structure only,
  joined to a gateway call through ``gen_ai.response.id`` (or span parentage when the client
  propagated a W3C traceparent to the gateway).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any, Final

from .. import semconv
from ..types import Span, StatusCode

__all__ = [
    "AGENT_OPERATIONS",
    "LLM_OPERATIONS",
    "agent_name_of",
    "ancestors",
    "exception_key",
    "genai_attribute",
    "has_exception_event",
    "input_messages",
    "is_agent_span",
    "is_exception_span",
    "is_failed_tool_span",
    "is_framework_llm_span",
    "is_gateway_call",
    "is_llm_span",
    "is_reward_span",
    "is_tool_span",
    "output_messages",
    "parse_json_attr",
    "response_text",
    "span_kind",
    "tool_call_ids",
]

LLM_OPERATIONS: Final = frozenset({semconv.OP_CHAT, semconv.OP_TEXT_COMPLETION, semconv.OP_GENERATE_CONTENT})
"""``gen_ai.operation.name`` values of an LLM call."""
AGENT_OPERATIONS: Final = frozenset({semconv.OP_INVOKE_AGENT, semconv.OP_INVOKE_WORKFLOW})
"""``gen_ai.operation.name`` values of an agent span (``create_agent`` encloses no calls); a
workflow is an agent span in both generations of the GenAI conventions."""
GEN_AI_SPAN_PREFIX: Final = "invoke_agent "
"""GenAI semconv names agent spans ``invoke_agent {gen_ai.agent.name}``."""
_SPAN_PREFIXES: Final = (GEN_AI_SPAN_PREFIX, "invoke_workflow ")

_BY_NAME: Final = {
    semconv.SPAN_LLM_CALL: semconv.KIND_LLM,
    semconv.SPAN_REWARD: semconv.KIND_REWARD,
    semconv.SPAN_EXCEPTION: semconv.KIND_EXCEPTION,
    semconv.SPAN_MESSAGE: semconv.KIND_MESSAGE,
    semconv.SPAN_OBSERVATION: semconv.KIND_OBSERVATION,
    semconv.SPAN_OBJECT: semconv.KIND_OBJECT,
    semconv.SPAN_OPERATION: semconv.KIND_OPERATION,
}


def span_kind(span: Span) -> str | None:
    """The span's role: ``agentbolt.span.kind`` if set, else derived from
    ``gen_ai.operation.name`` (chat/text_completion → ``llm``, execute_tool → ``tool``,
    invoke_agent → ``agent``), else from agentbolt's span names; ``None`` for other spans."""
    attrs = span.attributes
    kind = attrs.get(semconv.SPAN_KIND_ATTR)
    if isinstance(kind, str) and kind:
        return kind
    op = attrs.get(semconv.GEN_AI_OPERATION_NAME)
    if op in LLM_OPERATIONS:
        return semconv.KIND_LLM
    if op == semconv.OP_EXECUTE_TOOL:
        return semconv.KIND_TOOL
    if op in AGENT_OPERATIONS:
        return semconv.KIND_AGENT
    return _BY_NAME.get(span.name)


def is_llm_span(span: Span) -> bool:
    """Any LLM-call span, from the gateway or from a framework."""
    return span_kind(span) == semconv.KIND_LLM


_TOKEN_ATTRS: Final = (semconv.TOKEN_SOURCE, semconv.PROMPT_TOKEN_IDS, semconv.RESPONSE_TOKEN_IDS)


def is_gateway_call(span: Span) -> bool:
    """An LLM-call span written by the gateway: it carries token data or is named ``agentbolt.llm``."""
    if not is_llm_span(span):
        return False
    return span.name == semconv.SPAN_LLM_CALL or any(a in span.attributes for a in _TOKEN_ATTRS)


def is_framework_llm_span(span: Span) -> bool:
    """An LLM-call span from an adapter or GenAI instrumentation (no token data of its own)."""
    return is_llm_span(span) and not is_gateway_call(span)


def is_agent_span(span: Span) -> bool:
    """A span that encloses an agent's work (``invoke_agent`` or ``agentbolt.span.kind=agent``)."""
    return span_kind(span) == semconv.KIND_AGENT


def is_tool_span(span: Span) -> bool:
    """A tool execution (``execute_tool`` or ``agentbolt.span.kind=tool``)."""
    return span_kind(span) == semconv.KIND_TOOL


def is_failed_tool_span(span: Span) -> bool:
    """A tool span whose status is ERROR or that records an ``error.type``."""
    return is_tool_span(span) and (
        span.status.code == StatusCode.ERROR or bool(span.attributes.get(semconv.ERROR_TYPE))
    )


def is_reward_span(span: Span) -> bool:
    """A reward record (``agentbolt.reward`` or ``agentbolt.span.kind=reward``)."""
    return span_kind(span) == semconv.KIND_REWARD


def has_exception_event(span: Span) -> bool:
    """True when the span recorded an OpenTelemetry ``exception`` event."""
    return any(e.name == "exception" for e in span.events)


def is_exception_span(span: Span) -> bool:
    """An exception record: ``agentbolt.exception`` / kind ``exception``, or any span with
    status ERROR and an ``exception`` event."""
    if span_kind(span) == semconv.KIND_EXCEPTION:
        return True
    return span.status.code == StatusCode.ERROR and has_exception_event(span)


def exception_key(span: Span) -> tuple[str, str]:
    """(type, message) of the exception a span records, to recognise one exception that was
    recorded on several spans as it propagated."""
    for event in span.events:
        if event.name == "exception":
            return (
                str(event.attributes.get(semconv.EXCEPTION_TYPE, "")),
                str(event.attributes.get(semconv.EXCEPTION_MESSAGE, "")),
            )
    attrs = span.attributes
    etype = attrs.get(semconv.EXCEPTION_TYPE) or attrs.get(semconv.ERROR_TYPE) or ""
    return (str(etype), str(attrs.get(semconv.EXCEPTION_MESSAGE, span.status.message)))


def agent_name_of(span: Span) -> str | None:
    """The agent name an agent span declares: ``gen_ai.agent.name``, else ``gen_ai.agent.id``,
    else the span name without its ``invoke_agent`` prefix."""
    for key in (semconv.GEN_AI_AGENT_NAME, semconv.GEN_AI_WORKFLOW_NAME, semconv.GEN_AI_AGENT_ID):
        value = span.attributes.get(key)
        if isinstance(value, str) and value:
            return value
    name = span.name
    for prefix in _SPAN_PREFIXES:
        name = name.removeprefix(prefix)
    return name or None


_LEGACY_OF: Final = {new: old for old, new in semconv.LEGACY_ALIASES.items()}


def genai_attribute(span: Span, name: str) -> Any:
    """A GenAI attribute by its latest name, else by its name up to semantic-conventions 1.36
    (:data:`agentbolt.semconv.LEGACY_ALIASES`); ``None`` when neither is set."""
    value = span.attributes.get(name)
    if value is None and name in _LEGACY_OF:
        value = span.attributes.get(_LEGACY_OF[name])
    return value


def ancestors(span: Span, by_id: Mapping[str, Span]) -> Iterator[Span]:
    """The span's parent, grandparent, ... within ``by_id`` (stops at a missing parent or a cycle)."""
    seen = {span.span_id}
    parent = span.parent_span_id
    while parent is not None and parent not in seen:
        seen.add(parent)
        node = by_id.get(parent)
        if node is None:
            return
        yield node
        parent = node.parent_span_id


# --- response bodies ---------------------------------------------------------------------------


def parse_json_attr(span: Span, key: str) -> Any:
    """A JSON-encoded attribute decoded, or ``None`` when absent or not valid JSON."""
    raw = span.attributes.get(key)
    if not isinstance(raw, str) or not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _choice(span: Span) -> Mapping[str, Any] | None:
    body = parse_json_attr(span, semconv.LLM_RESPONSE)
    if not isinstance(body, Mapping):
        return None
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices:
        return None
    index = span.attributes.get(semconv.LLM_CHOICE_INDEX, 0)
    for choice in choices:
        if isinstance(choice, Mapping) and choice.get("index", 0) == index:
            return choice
    first = choices[0]
    return first if isinstance(first, Mapping) else None


def _content_text(content: Any) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        texts = [
            str(p.get("text") if p.get("text") is not None else p.get("content", ""))
            for p in content
            if isinstance(p, Mapping) and p.get("type", "text") == "text"
        ]
        return "".join(texts)
    return None


def _messages_attr(span: Span, key: str) -> list[Mapping[str, Any]]:
    messages = parse_json_attr(span, key)
    if isinstance(messages, Mapping):
        messages = [messages]
    if not isinstance(messages, list):
        return []
    return [m for m in messages if isinstance(m, Mapping)]


def _event_message(attributes: Mapping[str, Any], role: str) -> dict[str, Any]:
    """A message from a span event of the GenAI conventions up to 1.36 (``content`` and
    ``tool_calls`` as attributes, or a JSON ``message`` / ``body``)."""
    for key in ("message", "body", "gen_ai.event.content"):
        raw = attributes.get(key)
        if isinstance(raw, str) and raw.startswith("{"):
            try:
                body = json.loads(raw)
            except ValueError:
                continue
            if isinstance(body, Mapping):
                return {"role": role, **{k: v for k, v in body.items() if k != "role"}}
    message: dict[str, Any] = {"role": str(attributes.get("role") or role), "content": attributes.get("content")}
    if isinstance(attributes.get("tool_calls"), str):
        try:
            message["tool_calls"] = json.loads(str(attributes["tool_calls"]))
        except ValueError:
            pass
    return message


def input_messages(span: Span) -> list[Mapping[str, Any]]:
    """The messages a call was given: ``gen_ai.input.messages`` (latest GenAI conventions; OpenAI
    ``content`` or GenAI ``parts``), else the ``gen_ai.{system,user,assistant,tool}.message``
    span events of the conventions up to 1.36; ``[]`` when the span recorded none."""
    messages = _messages_attr(span, semconv.GEN_AI_INPUT_MESSAGES)
    if messages:
        return messages
    return [
        _event_message(e.attributes, semconv.LEGACY_MESSAGE_EVENTS[e.name])
        for e in span.events
        if e.name in semconv.LEGACY_MESSAGE_EVENTS
    ]


def output_messages(span: Span) -> list[Mapping[str, Any]]:
    """The messages a call produced: ``gen_ai.output.messages``, else the ``gen_ai.choice`` span
    events of the conventions up to 1.36; ``[]`` when the span recorded none."""
    messages = _messages_attr(span, semconv.GEN_AI_OUTPUT_MESSAGES)
    if messages:
        return messages
    return [_event_message(e.attributes, "assistant") for e in span.events if e.name == semconv.LEGACY_CHOICE_EVENT]


def _message_text(message: Mapping[str, Any]) -> str | None:
    if "parts" in message:  # OpenTelemetry GenAI message format
        parts = message.get("parts")
        if not isinstance(parts, list):
            return None
        return "".join(
            str(p.get("content", ""))
            for p in parts
            if isinstance(p, Mapping) and p.get("type") == "text" and p.get("content") is not None
        )
    return _content_text(message.get("content"))


def response_text(gateway: Span | None, framework: tuple[Span, ...] = ()) -> str | None:
    """The generated text of a call: from the gateway's response body
    (``choices[i].message.content`` or ``choices[i].text``), else from a framework span's
    ``gen_ai.output.messages``; ``None`` when no span recorded it. A call that only returned
    tool calls has text ``""``."""
    if gateway is not None:
        choice = _choice(gateway)
        if choice is not None:
            message = choice.get("message")
            if isinstance(message, Mapping):
                text = _content_text(message.get("content"))
                return "" if text is None else text
            if isinstance(choice.get("text"), str):
                return str(choice["text"])
    for span in framework:
        messages = output_messages(span)
        if messages:
            texts = [_message_text(m) for m in messages]
            return "".join(t for t in texts if t)
    return None


def tool_call_ids(gateway: Span | None, framework: tuple[Span, ...] = ()) -> list[str]:
    """Ids of the tool calls a call's response requested (OpenAI ``tool_calls[].id`` in the
    gateway's response body, or ``tool_call`` parts / ``tool_calls`` in a framework span's
    ``gen_ai.output.messages``)."""
    ids: list[str] = []
    if gateway is not None:
        choice = _choice(gateway)
        message = choice.get("message") if choice is not None else None
        if isinstance(message, Mapping):
            ids.extend(_ids(message.get("tool_calls")))
    for span in framework:
        for message in output_messages(span):
            ids.extend(_ids(message.get("tool_calls")))
            parts = message.get("parts")
            if isinstance(parts, list):
                ids.extend(
                    str(p["id"])
                    for p in parts
                    if isinstance(p, Mapping) and p.get("type") == "tool_call" and p.get("id") is not None
                )
    return list(dict.fromkeys(ids))


def _ids(calls: Any) -> Iterator[str]:
    if isinstance(calls, list):
        for call in calls:
            if isinstance(call, Mapping) and call.get("id") is not None:
                yield str(call["id"])
