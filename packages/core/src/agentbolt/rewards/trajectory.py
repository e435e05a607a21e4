"""What a judge reads: a rollout's LLM calls as one transcript.

The gateway records each call's input and output messages (``gen_ai.input.messages`` /
``gen_ai.output.messages``). A conversation's later calls repeat the earlier ones, so the
transcript shows each call's messages only where they extend what came before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from .. import semconv
from .. import types as t

__all__ = ["Trajectory", "readable_text", "render_messages", "trajectory_from_spans"]

_MAX_MESSAGE_CHARS = 4000


@dataclass(frozen=True)
class Trajectory:
    """A judge's view of one attempt: the messages in order, and an id to name it by."""

    messages: list[dict[str, Any]]
    """Chat messages (``role``, ``content``, optional ``tool_calls``) in the order they happened."""
    trajectory_id: str = ""
    """The rollout id (or any label); judges cache and report by it."""
    metadata: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of_text(cls, task: str, answer: str, trajectory_id: str = "") -> Trajectory:
        """A one-turn trajectory: the task as the user message, the answer as the assistant's."""
        return cls(
            [{"role": "user", "content": task}, {"role": "assistant", "content": answer}], trajectory_id=trajectory_id
        )

    def task_text(self) -> str:
        """The first user message (what was asked)."""
        for message in self.messages:
            if message.get("role") == "user":
                return readable_text(message.get("content"))
        return ""

    def render(self) -> str:
        """The transcript as text."""
        return render_messages(self.messages)


_IMAGE_PARTS = frozenset({"image_url", "input_image", "image"})


def readable_text(content: Any) -> str:
    """A chat message's ``content`` as a reader sees it (Chat Completions, Responses or Messages
    format): a string itself; a list of parts, their texts one per line, with ``[image]`` for an
    image and nothing for other parts; ``None``, empty; anything else, its JSON."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(text for text in map(_part_text, content) if text is not None)
    return orjson.dumps(content, default=str).decode()


def _part_text(part: Any) -> str | None:
    if isinstance(part, str):
        return part
    if isinstance(part, Mapping):
        if isinstance(part.get("text"), str):
            return str(part["text"])
        if part.get("type") in _IMAGE_PARTS:
            return "[image]"
    return None


def render_messages(messages: Sequence[Mapping[str, Any]]) -> str:
    """``[role] text`` blocks; tool calls as ``name(arguments)``; long texts cut with a note."""
    blocks = []
    for message in messages:
        role = str(message.get("role", "?"))
        text = readable_text(message.get("content"))
        calls = message.get("tool_calls") or []
        for call in calls if isinstance(calls, list) else []:
            fn = call.get("function", {}) if isinstance(call, Mapping) else {}
            text += f"\n<tool call> {fn.get('name', '?')}({fn.get('arguments', '')})"
        if len(text) > _MAX_MESSAGE_CHARS:
            text = text[:_MAX_MESSAGE_CHARS] + f" ...[{len(text) - _MAX_MESSAGE_CHARS} more characters]"
        blocks.append(f"[{role}] {text.strip()}")
    return "\n".join(blocks)


def _json_list(span: t.Span, key: str) -> list[dict[str, Any]]:
    raw = span.attributes.get(key)
    if not isinstance(raw, str):
        return []
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return []
    return [dict(m) for m in value if isinstance(m, Mapping)] if isinstance(value, list) else []


def _norm(message: Mapping[str, Any]) -> tuple[str, str]:
    return str(message.get("role", "")), readable_text(message.get("content")).strip()


def trajectory_from_spans(spans: Sequence[t.Span], trajectory_id: str = "") -> Trajectory:
    """The transcript of the LLM calls among ``spans`` (in ``seq`` order; failed calls left out)."""
    messages: list[dict[str, Any]] = []
    for span in sorted(spans, key=lambda s: (s.seq or 0, s.start_time_ns)):
        if semconv.TOKEN_SOURCE not in span.attributes or span.status.code is t.StatusCode.ERROR:
            continue  # not a gateway call, or one that failed
        inputs = _json_list(span, semconv.GEN_AI_INPUT_MESSAGES)
        outputs = [
            {k: v for k, v in m.items() if k != "finish_reason"}
            for m in _json_list(span, semconv.GEN_AI_OUTPUT_MESSAGES)
        ]
        seen = [_norm(m) for m in messages]
        if seen and [_norm(m) for m in inputs[: len(seen)]] == seen:
            inputs = inputs[len(seen) :]  # a conversation that goes on: only the new turns
        messages.extend(inputs)
        messages.extend(outputs[:1])
    return Trajectory(messages, trajectory_id=trajectory_id)
