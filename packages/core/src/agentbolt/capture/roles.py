"""Name the agent of an LLM call from what the call already carries — no change to the agent.

An agent on one client with several roles (a planner and a solver with different system
prompts) sends nothing that says which role is calling. :class:`AgentRoles` names each call
from its request, in the gateway, so LightningRL's ``agent_match`` can select roles::

    CaptureOptions(agent_names={"planner": "You plan", "solver": re.compile(r"^You solve")})
    CaptureOptions(agent_names=AgentRoles(tools={"searcher": "web_search"}))
    CaptureOptions(agent_names=lambda request: "judge" if request.get("max_tokens") == 1 else None)

passed as ``Trainer(agent, capture=...)`` (``agentbolt gateway serve --agent-name NAME=TEXT`` builds
the first kind).

Precedence, per call: the ``X-Agentbolt-Agent-Name`` header (the explicit way) over these rules;
a framework adapter's agent span (LightningRL's nearest enclosing agent) over the gateway's name.
The rules see the request as Chat Completions (Responses and Messages API requests are
translated first: ``instructions`` / ``system`` become the system message).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import UserError

__all__ = ["AgentNamer", "AgentRoles", "as_agent_namer", "system_prompt_of", "tool_names_of"]

log = logging.getLogger(__name__)

AgentNamer = Callable[[Mapping[str, Any]], "str | None"]
"""``(chat completions request) -> agent name or None``."""


def content_text(content: Any) -> str:
    """The text of a chat message's ``content``: a string, or the joined ``text`` of its parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text") or "") for p in content if isinstance(p, Mapping))
    return ""


def system_prompt_of(request: Mapping[str, Any]) -> str:
    """The text of the request's system (or developer) messages, joined."""
    return "\n".join(
        content_text(m.get("content"))
        for m in request.get("messages") or ()
        if isinstance(m, Mapping) and m.get("role") in ("system", "developer")
    )


def tool_names_of(request: Mapping[str, Any]) -> set[str]:
    """Names of the function tools the request offers."""
    names = set()
    for tool in request.get("tools") or ():
        if isinstance(tool, Mapping):
            function = tool.get("function")
            fn = function if isinstance(function, Mapping) else tool
            if fn.get("name"):
                names.add(str(fn["name"]))
    return names


@dataclass(frozen=True)
class AgentRoles:
    """Rules that name a call's agent (first match wins: ``function``, ``system_prompt``, ``tools``)."""

    system_prompt: Mapping[str, str | re.Pattern[str]] = field(default_factory=dict)
    """Agent name -> a substring of the system prompt, or a compiled regex searched in it."""
    tools: Mapping[str, str | Sequence[str]] = field(default_factory=dict)
    """Agent name -> a tool name (or several, all required) the call offers."""
    function: AgentNamer | None = None
    """A function of the request returning a name, or None to fall through to the other rules."""

    def __post_init__(self) -> None:
        for name, pattern in self.system_prompt.items():
            if not isinstance(pattern, str | re.Pattern) or pattern == "":
                raise UserError(
                    f"agent {name!r}: a system-prompt rule is a non-empty substring or a re.compile(...) pattern, "
                    f"got {pattern!r}"
                )

    @classmethod
    def from_specs(cls, specs: Sequence[str]) -> AgentRoles | None:
        """System-prompt rules from ``NAME=TEXT`` (a substring) or ``NAME=re:PATTERN`` (a regex
        searched) strings, as the CLI's ``--agent-name`` gives them; ``None`` for no spec."""
        rules: dict[str, str | re.Pattern[str]] = {}
        for spec in specs:
            name, sep, text = spec.partition("=")
            if not sep or not name or not text:
                raise UserError(f"an agent-name rule is NAME=TEXT or NAME=re:PATTERN, got {spec!r}")
            try:
                rules[name] = re.compile(text[3:]) if text.startswith("re:") else text
            except re.error as exc:
                raise UserError(f"agent {name!r}: {text[3:]!r} is not a regular expression: {exc}") from None
        return cls(system_prompt=rules) if rules else None

    def __call__(self, request: Mapping[str, Any]) -> str | None:
        if self.function is not None:
            name = self.function(request)
            if name:
                return str(name)
        if self.system_prompt:
            prompt = system_prompt_of(request)
            for name, pattern in self.system_prompt.items():
                if (pattern.search(prompt) if isinstance(pattern, re.Pattern) else pattern in prompt) and prompt:
                    return name
        if self.tools:
            offered = tool_names_of(request)
            for name, wanted in self.tools.items():
                needed = {wanted} if isinstance(wanted, str) else set(wanted)
                if needed and needed <= offered:
                    return name
        return None


def as_agent_namer(spec: AgentRoles | Mapping[str, Any] | AgentNamer | None) -> AgentNamer | None:
    """An :data:`AgentNamer` from what ``CaptureOptions(agent_names=...)`` accepts: :class:`AgentRoles`, a
    mapping of agent name -> system-prompt substring / regex, or a function of the request."""
    if spec is None or isinstance(spec, AgentRoles):
        return spec
    if isinstance(spec, Mapping):
        return AgentRoles(system_prompt=dict(spec))
    if callable(spec):
        return AgentRoles(function=spec)
    raise UserError(
        f"agent_names takes AgentRoles, a mapping of agent name -> system-prompt substring or regex, or a function "
        f"of the request; got {type(spec).__name__}"
    )
