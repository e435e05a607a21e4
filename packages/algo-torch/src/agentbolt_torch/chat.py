"""Chat rendering and tool calls: OpenAI messages -> prompt text, generated text -> ``tool_calls``.

Rendering always goes through the tokenizer's chat template. Templates differ in what they
support, so each tokenizer is probed once (:func:`template_capabilities`):

- a template that renders ``tools`` (e.g. Qwen2.5's, or :data:`~agentbolt_torch.models.CHATML_TOOLS_TEMPLATE`)
  gets them natively;
- a template that ignores them (SmolLM2's) gets the **fallback**: the tool schemas are written
  into the system prompt (appended to the first system message, or a new one) with the
  instruction to answer with ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks;
- likewise a template that cannot render assistant ``tool_calls`` or ``tool`` messages gets
  them as text: the calls as ``<tool_call>`` blocks in the assistant's content, tool results
  as ``<tool_response>...</tool_response>`` blocks in a user turn.

Generated text is parsed back with :func:`parse_tool_calls`: every
``<tool_call>{json}</tool_call>`` block (a final unclosed block is accepted too) becomes an
OpenAI ``tool_calls`` entry and the text outside the blocks stays the content. If any block is
not valid JSON with a ``name``, nothing is parsed: the whole text is returned as content, so
the agent (and reward code) sees exactly what the model wrote.
"""

from __future__ import annotations

import json
import re
import secrets
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentbolt.errors import UserError

__all__ = [
    "ParsedOutput",
    "RenderedPrompt",
    "TemplateCapabilities",
    "ToolCallStreamFilter",
    "forced_tool_call_prefix",
    "normalize_messages",
    "parse_tool_calls",
    "render_chat",
    "render_request",
    "reply_text",
    "template_capabilities",
    "tools_system_prompt",
]

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"

_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_UNCLOSED = re.compile(r"<tool_call>\s*(\{.*\})\s*$", re.DOTALL)


@dataclass(frozen=True)
class TemplateCapabilities:
    """What a tokenizer's chat template renders natively."""

    tools: bool
    """``tools=`` appear in the prompt."""
    tool_calls: bool
    """Assistant ``tool_calls`` and ``tool`` messages render."""


_PROBE_FN = "agentbolt_probe_function"
_PROBE_CALL = "agentbolt_probe_call"
_caps_cache: dict[tuple[int, str], TemplateCapabilities] = {}
_caps_lock = threading.Lock()


def template_capabilities(tokenizer: Any) -> TemplateCapabilities:
    """Probe (once per tokenizer and template) whether the chat template renders tools and tool calls."""
    key = (id(tokenizer), str(getattr(tokenizer, "chat_template", "")))
    with _caps_lock:
        if key in _caps_cache:
            return _caps_cache[key]
    user = {"role": "user", "content": "probe"}
    tool = {"type": "function", "function": {"name": _PROBE_FN, "description": "d", "parameters": {"type": "object"}}}
    try:
        text = tokenizer.apply_chat_template([user], tools=[tool], tokenize=False, add_generation_prompt=True)
        tools_ok = _PROBE_FN in text
    except Exception:
        tools_ok = False
    call = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "c0", "type": "function", "function": {"name": _PROBE_CALL, "arguments": {"x": 1}}}],
    }
    result = {"role": "tool", "tool_call_id": "c0", "name": _PROBE_CALL, "content": "probe-result-7"}
    try:
        text = tokenizer.apply_chat_template([user, call, result], tokenize=False, add_generation_prompt=True)
        calls_ok = _PROBE_CALL in text and "probe-result-7" in text
    except Exception:
        calls_ok = False
    caps = TemplateCapabilities(tools=tools_ok, tool_calls=calls_ok)
    with _caps_lock:
        _caps_cache[key] = caps
    return caps


def _content_text(content: Any) -> str | None:
    """OpenAI content (a string, a list of parts, or None) as plain text."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, Mapping) and part.get("type") in ("text", "input_text", "output_text"):
                parts.append(str(part.get("text", "")))
            elif isinstance(part, Mapping) and part.get("type") == "refusal":
                parts.append(str(part.get("refusal", "")))
            else:
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise UserError(f"unsupported message content part {kind!r}: this policy reads text only")
        return "".join(parts)
    raise UserError(f"unsupported message content of type {type(content).__name__}")


def _arguments_object(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return arguments
    return arguments


def normalize_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Copy OpenAI messages into the shape chat templates expect.

    Content parts become text; ``developer`` becomes ``system``; tool-call arguments become
    objects (templates render them with ``tojson``) when they are valid JSON.
    """
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or "role" not in message:
            raise UserError(f"messages[{i}] must be an object with a 'role'")
        role = message["role"]
        if role == "developer":
            role = "system"
        msg: dict[str, Any] = {"role": role, "content": _content_text(message.get("content"))}
        if role == "assistant" and message.get("tool_calls"):
            calls = []
            for call in message["tool_calls"]:
                fn = call.get("function") or {}
                calls.append(
                    {
                        "id": call.get("id"),
                        "type": "function",
                        "function": {"name": fn.get("name", ""), "arguments": _arguments_object(fn.get("arguments"))},
                    }
                )
            msg["tool_calls"] = calls
        elif msg["content"] is None:
            msg["content"] = ""
        for key in ("name", "tool_call_id"):
            if message.get(key) is not None:
                msg[key] = message[key]
        out.append(msg)
    return out


def tools_system_prompt(tools: Sequence[Mapping[str, Any]]) -> str:
    """The fallback tool instructions appended to the system prompt (Qwen2.5's wording)."""
    lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        f"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{lines}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
        "</tool_call>"
    )


def _tool_call_text(call: Mapping[str, Any]) -> str:
    fn = call.get("function") or {}
    args = fn.get("arguments")
    args_json = args if isinstance(args, str) else json.dumps(args if args is not None else {}, ensure_ascii=False)
    return f'<tool_call>\n{{"name": {json.dumps(fn.get("name", ""), ensure_ascii=False)}, "arguments": {args_json}}}\n</tool_call>'


def _calls_as_text(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rewrite assistant tool calls and tool results as plain text turns (the fallback)."""
    out: list[dict[str, Any]] = []
    for msg in messages:
        if msg["role"] == "assistant" and msg.get("tool_calls"):
            blocks = "\n".join(_tool_call_text(c) for c in msg["tool_calls"])
            content = msg.get("content") or ""
            out.append({"role": "assistant", "content": f"{content}\n{blocks}" if content else blocks})
        elif msg["role"] == "tool":
            block = f"<tool_response>\n{msg.get('content') or ''}\n</tool_response>"
            if out and out[-1].get("_tool_turn"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool_turn": True})
        else:
            out.append(msg)
    for msg in out:
        msg.pop("_tool_turn", None)
    return out


def render_chat(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    *,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> str:
    """Render OpenAI-style ``messages`` (and ``tools``) to prompt text with the tokenizer's template.

    ``continue_final_message=True`` leaves the last (assistant) message open so the model
    continues it (a prefill such as ``"<sql>SELECT"``).
    """
    if not messages:
        raise UserError("messages must not be empty")
    msgs = normalize_messages(messages)
    caps = template_capabilities(tokenizer)
    tools = list(tools or [])
    if not caps.tool_calls:
        msgs = _calls_as_text(msgs)
    kwargs: dict[str, Any] = dict(chat_template_kwargs or {})
    if tools and caps.tools:
        kwargs["tools"] = tools
    elif tools:
        instructions = tools_system_prompt(tools)
        if msgs[0]["role"] == "system":
            msgs[0] = {**msgs[0], "content": f"{msgs[0]['content']}\n\n{instructions}".lstrip()}
        else:
            msgs.insert(0, {"role": "system", "content": f"You are a helpful assistant.\n\n{instructions}"})
    if continue_final_message:
        if msgs[-1]["role"] != "assistant":
            raise UserError("continue_final_message needs the last message to be from the assistant")
        add_generation_prompt = False
    try:
        return tokenizer.apply_chat_template(
            msgs,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            **kwargs,
        )
    except Exception as exc:  # jinja errors: a message the template cannot render
        raise UserError(f"the chat template could not render these messages: {exc}") from exc


def forced_tool_call_prefix(tool_choice: Any, tools: Sequence[Mapping[str, Any]]) -> str:
    """The start of the reply that ``tool_choice`` forces (``""`` for ``auto``, ``none`` or absent).

    ``"required"`` opens a tool call, ``<tool_call>\n{"name":``; a named function
    (``{"type": "function", "function": {"name": X}}``) also fixes the name,
    ``<tool_call>\n{"name": "X", "arguments":``. The server appends this text to the rendered
    prompt, so its tokens are **prompt** tokens (never sampled, never trained as the policy's
    output); the model continues it, and the reply is parsed with it in front. The text stops
    before a space: BPE tokenizers attach the space to the next token (`` {"``), so a forced
    trailing space would leave the model at a token boundary it never saw.
    """
    if tool_choice in (None, "auto", "none"):
        return ""
    names = [str((t.get("function") or {}).get("name", "")) for t in tools]
    if tool_choice == "required":
        return TOOL_CALL_OPEN + '\n{"name":'
    if isinstance(tool_choice, Mapping) and isinstance(tool_choice.get("function"), Mapping):
        name = tool_choice["function"].get("name")
        if name not in names:
            raise UserError(f"tool_choice names {name!r}, which is not one of the tools {names}")
        return f'{TOOL_CALL_OPEN}\n{{"name": {json.dumps(name, ensure_ascii=False)}, "arguments":'
    raise UserError(f"unsupported tool_choice {tool_choice!r}: use 'auto', 'none', 'required' or a named function")


@dataclass(frozen=True)
class RenderedPrompt:
    """A chat request rendered the way the policy server renders it."""

    text: str
    """The prompt text: the rendered chat, then ``forced``."""
    forced: str
    """The start of the reply that ``tool_choice`` forces (prompt text; ``""`` for ``auto``)."""
    use_tools: bool
    """Whether tools were offered (the reply is then parsed for ``<tool_call>`` blocks)."""


def render_request(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    tool_choice: Any = None,
    *,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> RenderedPrompt:
    """The prompt of a ``/v1/chat/completions`` request, exactly as the policy server builds it.

    Tools are offered unless ``tool_choice`` is ``"none"``; a forcing ``tool_choice`` appends
    :func:`forced_tool_call_prefix`. The server tokenizes ``text`` with
    ``add_special_tokens=False``; anything that trains on what the server serves (e.g.
    :mod:`agentbolt_torch.training.demonstrations`) renders through this function too.
    """
    tools = list(tools or [])
    use_tools = bool(tools) and tool_choice != "none"
    forced = forced_tool_call_prefix(tool_choice, tools) if use_tools else ""
    text = render_chat(
        tokenizer,
        messages,
        tools if use_tools else None,
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message,
        chat_template_kwargs=chat_template_kwargs,
    )
    return RenderedPrompt(text=text + forced, forced=forced, use_tools=use_tools)


def reply_text(message: Mapping[str, Any], forced: str = "") -> str:
    """The text a policy generates for an assistant ``message`` (after the prompt's ``forced`` start).

    Content, then each tool call as a ``<tool_call>`` block -- the form :func:`parse_tool_calls`
    reads back into the same calls, and the form in which :func:`render_chat` shows the call in
    later turns on templates without native tool calls. Raises :class:`UserError` when the reply
    does not begin with ``forced``.
    """
    normalized = normalize_messages([{**message, "role": "assistant"}])[0]
    text = _calls_as_text([normalized])[0]["content"] or ""
    if not text.startswith(forced):
        raise UserError(f"the reply does not begin with the forced tool-call start {forced!r}: {text[:80]!r}")
    return text[len(forced) :]


# --------------------------------------------------------------------------------------------
# Parsing tool calls out of generated text
# --------------------------------------------------------------------------------------------


@dataclass
class ParsedOutput:
    """Generated text split into content and tool calls."""

    content: str | None
    """Text outside the tool-call blocks (``None`` when empty and there are tool calls)."""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    """OpenAI ``tool_calls`` entries: ``{"id", "type": "function", "function": {"name", "arguments"}}``."""


def _new_call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


def _parse_call(body: str) -> dict[str, Any] | None:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            json.loads(args)
        except json.JSONDecodeError:
            return None
        args_json = args
    else:
        args_json = json.dumps(args, ensure_ascii=False)
    return {"id": _new_call_id(), "type": "function", "function": {"name": obj["name"], "arguments": args_json}}


def parse_tool_calls(text: str) -> ParsedOutput:
    """Split ``text`` into content and ``<tool_call>`` blocks (see the module doc)."""
    if TOOL_CALL_OPEN not in text:
        return ParsedOutput(content=text)
    calls: list[dict[str, Any]] = []
    pieces: list[str] = []
    last = 0
    for match in _BLOCK.finditer(text):
        call = _parse_call(match.group(1))
        if call is None:
            return ParsedOutput(content=text)
        calls.append(call)
        pieces.append(text[last : match.start()])
        last = match.end()
    rest = text[last:]
    unclosed = _UNCLOSED.search(rest)
    if unclosed is not None:
        call = _parse_call(unclosed.group(1))
        if call is None:
            return ParsedOutput(content=text)
        calls.append(call)
        pieces.append(rest[: unclosed.start()])
    else:
        if TOOL_CALL_OPEN in rest:
            return ParsedOutput(content=text)
        pieces.append(rest)
    if not calls:
        return ParsedOutput(content=text)
    content = "".join(pieces).strip()
    return ParsedOutput(content=content or None, tool_calls=calls)


class ToolCallStreamFilter:
    """Streams content text while holding back anything that may be a tool call.

    Feed text deltas with :meth:`feed`; it returns the part that is safe to stream as content
    (text before a ``<tool_call>`` tag, never a partial tag). :meth:`finish` parses the whole
    text and returns ``(remaining_content, tool_calls)``; when the held-back text turns out
    not to be a valid tool call it is returned as content.
    """

    def __init__(self) -> None:
        self.text = ""
        self._streamed = 0
        self._in_call = False

    def feed(self, delta: str) -> str:
        """Add ``delta``; return the content that can be streamed now."""
        self.text += delta
        if self._in_call:
            return ""
        start = self.text.find(TOOL_CALL_OPEN, self._streamed)
        if start >= 0:
            self._in_call = True
            out, self._streamed = self.text[self._streamed : start], start
            return out
        safe = len(self.text)
        for k in range(min(len(TOOL_CALL_OPEN) - 1, len(self.text)), 0, -1):
            if self.text.endswith(TOOL_CALL_OPEN[:k]):
                safe -= k
                break
        out = self.text[self._streamed : safe]
        self._streamed = max(self._streamed, safe)
        return out

    def finish(self, final_text: str | None = None) -> tuple[str, list[dict[str, Any]]]:
        """Parse the complete text; returns ``(content not streamed yet, tool_calls)``."""
        if final_text is not None:
            self.text = final_text
        parsed = parse_tool_calls(self.text)
        if not parsed.tool_calls:
            return self.text[self._streamed :], []
        # Content after the blocks (rare) is sent at the end; content before them was streamed.
        streamed = self.text[: self._streamed].strip()
        content = (parsed.content or "").strip()
        rest = content[len(streamed) :].strip() if content.startswith(streamed) else ""
        return rest, parsed.tool_calls
