"""Tool calls an LLM output requested, waiting for the tool spans that run them.

Frameworks report a tool's run apart from the LLM output that requested it, and each leaves out
something the other has: AutoGen's tool span has the call id but not the arguments, the Agents
SDK's function span the name and arguments but not the call id. :class:`ToolCallRequests` joins
them: an adapter adds the calls an LLM output requested (by scope: the framework unit both
report under) and the tool span takes its call back.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

__all__ = ["ToolCall", "ToolCallRequests", "tool_calls_of"]


class ToolCall(NamedTuple):
    """A tool call an LLM output requested."""

    id: str
    name: str | None
    arguments: str | None


class ToolCallRequests:
    """Requested tool calls not yet run, per scope (thread-safe, bounded: past ``limit`` scopes
    the oldest is forgotten, so calls that never run cannot pile up)."""

    def __init__(self, limit: int = 4096) -> None:
        self._scopes: collections.OrderedDict[Hashable, list[ToolCall]] = collections.OrderedDict()
        self._limit = limit
        self._lock = threading.Lock()

    def add(self, scope: Hashable, calls: Iterable[ToolCall]) -> None:
        """Remember ``calls`` (those with an id) under ``scope`` (none under a ``None`` scope)."""
        calls = [c for c in calls if c.id]
        if not calls or scope is None:
            return
        with self._lock:
            self._scopes.setdefault(scope, []).extend(calls)
            while len(self._scopes) > self._limit:
                self._scopes.popitem(last=False)

    def take(
        self, scope: Hashable, *, call_id: str | None = None, name: str | None = None, arguments: str | None = None
    ) -> ToolCall | None:
        """Forget and return the pending call of ``scope`` that a tool span ran: the one with
        ``call_id`` when given, else the first named ``name`` (preferably with these
        ``arguments``); ``None`` when there is none."""
        with self._lock:
            calls = self._scopes.get(scope)
            if not calls:
                return None
            for same_args in (True, False):
                for i, call in enumerate(calls):
                    if (call.id == call_id) if call_id is not None else _named(call, name, arguments, same_args):
                        del calls[i]
                        return call
        return None

    def drop(self, scope: Hashable) -> None:
        """Forget the calls of ``scope`` (it ended: what was not run never will be)."""
        with self._lock:
            self._scopes.pop(scope, None)

    def clear(self) -> None:
        with self._lock:
            self._scopes.clear()


def tool_calls_of(messages: Sequence[Mapping[str, Any]]) -> list[ToolCall]:
    """The tool calls of chat messages as ``gen_ai.output.messages`` hold them."""
    return [
        ToolCall(str(c.get("id")), str(fn.get("name")), str(fn.get("arguments")))
        for m in messages
        for c in (m.get("tool_calls") or ())
        if isinstance(c, Mapping) and isinstance(fn := c.get("function"), Mapping) and c.get("id")
    ]


def _named(call: ToolCall, name: str | None, arguments: str | None, same_args: bool) -> bool:
    return call.name == name and (not same_args or call.arguments == arguments)
