"""Hooks for a gateway that serves callers other than rollouts (``agentbolt serve``'s live clients).

A rollout's agent names its rollout and attempt (in the path or in headers). A live client
does not: a :class:`CallRouter` given to the :class:`~agentbolt.gateway.Gateway` decides
which rollout and attempt each such call is recorded under (a session) and hears when the call
ended. :data:`ExtraRoute` handlers answer further routes on the gateway's port (the feedback
API), behind the same token and Host checks as the LLM routes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from .http import Request
from .recorder import CallRecord

__all__ = ["CallRouter", "ExtraRoute", "RouteError", "RoutedCall"]


class RouteError(Exception):
    """A call the router refuses: answered with ``status`` and an OpenAI-style error."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_


@dataclass
class RoutedCall:
    """Where a routed call is recorded, and what the client is told about it."""

    rollout_id: str
    """The rollout the call's span goes to."""
    attempt_id: str
    """Its attempt."""
    headers: list[tuple[str, str]] = field(default_factory=list)
    """Response headers added to the answer (e.g. the session id)."""
    context: Any = None
    """The router's own state for :meth:`CallRouter.finished`."""


class CallRouter(Protocol):
    """Routes calls that name no rollout (see the module docstring)."""

    async def route(self, headers: Mapping[str, str], body: Mapping[str, Any], api: str) -> RoutedCall:
        """The rollout and attempt of a call; raise :class:`RouteError` to refuse it.

        ``headers`` are the request's (lower-case names), ``body`` the parsed JSON body as the
        client sent it, ``api`` the route (``/v1/chat/completions``, ``/v1/responses``,
        ``/v1/messages``, ``/v1/completions``).
        """
        ...

    def finished(self, call: RoutedCall, record: CallRecord | None) -> None:
        """The call ended; ``record`` is what was recorded (``None``: it never went upstream)."""
        ...


ExtraRoute = Callable[[Request], Awaitable[tuple[int, bytes, list[tuple[str, str]]]]]
"""``async handler(request) -> (status, JSON body, headers)`` for one extra path."""
