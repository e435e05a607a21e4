"""Agent loops: what turns observations into actions by calling the model.

A loop is any async callable ``loop(env, llm, model)``: ``env`` is the rollout's
:class:`~agentbolt_openenv.session.OpenEnvSession` (already reset), ``llm`` an
``openai.AsyncOpenAI`` client pointed at agentbolt's gateway, ``model`` the model name to send.
It calls the model, ``await env.step(action)``, and repeats until ``env.over``. Every model call
goes through the gateway (exact token ids), every step's reward is recorded by the session.

:class:`ReActLoop` is the default: a chat in which each observation is a user message and each
reply a thought followed by one action in ``<action>...</action>`` tags.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentbolt.capture.emit import emit_message

from .errors import OpenEnvActionError
from .session import OpenEnvSession

__all__ = ["DEFAULT_SYSTEM_PROMPT", "ActionParseError", "EpisodeLoop", "ReActLoop", "parse_tagged_action"]

DEFAULT_SYSTEM_PROMPT = (
    "You act in an environment, one step at a time. Each user message is the environment's observation. "
    "Reply with a short thought, then exactly one action: a JSON object that matches this schema, inside "
    "<action></action> tags.\nAction schema: {action_schema}"
)
"""The default loop's system prompt; ``{action_schema}`` becomes the server's action schema."""

_ACTION = re.compile(r"<action>(.*?)</action>", re.DOTALL)


class EpisodeLoop(Protocol):
    """An agent loop: run the episode of ``env`` by calling ``model`` through ``llm``."""

    async def __call__(self, env: OpenEnvSession, llm: Any, model: str) -> None: ...


class ActionParseError(ValueError):
    """A model reply holds no action the loop can send; the message says what was expected."""


def _fields(schema: Mapping[str, Any] | None) -> list[str]:
    properties = (schema or {}).get("properties") or {}
    return [name for name in properties if name != "metadata"]


def parse_tagged_action(text: str, schema: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The action in the last ``<action>...</action>`` of ``text``.

    A JSON object is the action as it is. Anything else is accepted when the action schema has
    exactly one field (besides ``metadata``): ``<action>42</action>`` becomes ``{"guess": 42}``
    (the value read as JSON when it parses, else as the text). The server validates the result.
    """
    found = _ACTION.findall(text)
    if not found:
        raise ActionParseError("no <action>...</action> in the reply")
    body = found[-1].strip()
    try:
        value = json.loads(body)
    except ValueError:
        value = body
    if isinstance(value, dict):
        return value
    names = _fields(schema)
    if len(names) == 1:
        return {names[0]: value}
    raise ActionParseError(f"the action {body[:80]!r} is not a JSON object")


def render_observation(observation: Mapping[str, Any]) -> str:
    """An observation as a user message: a lone text field as its text, else compact JSON."""
    shown = {k: v for k, v in observation.items() if k != "metadata" and v not in (None, "", [], {})}
    texts = [v for v in shown.values() if isinstance(v, str)]
    if len(shown) == 1 and len(texts) == 1:
        return texts[0]
    return json.dumps(shown, ensure_ascii=False, sort_keys=True)


@dataclass
class ReActLoop:
    """The default agent loop: observation → thought + action → step, until the episode is over.

    The chat starts with ``system_prompt`` (``{action_schema}`` replaced by the server's action
    schema), then ``examples`` (few-shot messages), then the first observation. Each reply is
    parsed by ``parse_action(text, schema)``; the action is stepped and the next observation
    becomes the next user message. A reply with no valid action, or an action the server
    refuses, is answered with what was wrong and costs a turn (no step). At most
    ``env.max_turns`` model calls.
    """

    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    examples: Sequence[Mapping[str, str]] = ()
    """Few-shot chat messages between the system prompt and the first observation."""
    render: Callable[[Mapping[str, Any]], str] = render_observation
    """An observation as the text of a user message."""
    parse_action: Callable[[str, Mapping[str, Any] | None], dict[str, Any]] = parse_tagged_action
    """A reply's text (and the action schema) → the action; raises :class:`ActionParseError`."""
    request: Mapping[str, Any] = field(default_factory=dict)
    """Extra arguments of each ``chat.completions.create`` call (``max_tokens``, ``stop``...)."""
    action_schema: Mapping[str, Any] | None = None
    """The action schema; ``None``: the server's (``GET /schema``, read by the agent)."""

    async def __call__(self, env: OpenEnvSession, llm: Any, model: str) -> None:
        schema = self.action_schema if self.action_schema is not None else env.action_schema
        prompt = self.system_prompt.replace("{action_schema}", json.dumps(schema, sort_keys=True) if schema else "{}")
        messages: list[dict[str, Any]] = [{"role": "system", "content": prompt}]
        messages += [dict(m) for m in self.examples]
        messages.append({"role": "user", "content": self.render(env.observation)})
        for _ in range(env.max_turns):
            if env.over:
                return
            reply = await llm.chat.completions.create(model=model, messages=messages, **dict(self.request))
            text = reply.choices[0].message.content or ""
            messages.append({"role": "assistant", "content": text})
            try:
                action = self.parse_action(text, schema)
                step = await env.step(action)
            except (ActionParseError, OpenEnvActionError) as exc:
                emit_message(f"openenv: no step this turn: {exc}")
                messages.append({"role": "user", "content": f"Invalid action: {exc}. Reply with <action>...</action>."})
                continue
            messages.append({"role": "user", "content": self.render(step.observation)})
