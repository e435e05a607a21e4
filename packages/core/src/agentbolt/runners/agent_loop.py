"""The event loop agents run on: asyncio's, safe against clients that agents never close.

An agent commonly makes an ``openai.AsyncOpenAI`` client per rollout and drops it without closing
it (the quickstart agent does). When the garbage collector finds such a client, it finalizes the
objects of the dropped graph together, on whichever thread happened to trigger the collection:

1. the connection's asyncio transport closes its socket (``_SelectorTransport.__del__``), so the
   file descriptor number is free again, but it does not mark itself closed;
2. the openai client's own ``__del__`` resurrects the graph: it schedules ``aclose()`` on the
   event loop *running on the collecting thread* (openai's ``AsyncHttpxClientWrapper``), which
   may be the gateway's or the trainer's loop;
3. meanwhile the agent loop opens a new connection, which gets the same descriptor number and
   waits for its answer;
4. ``aclose()`` then closes the old transport, which removes the reader of *that number* from the
   agent loop: the new connection's answer arrives and nobody reads it. The model call waits for
   the client's timeout (600 s by default for openai), then fails.

That is CPython's open bug https://github.com/python/cpython/issues/130141 ("resurrected asyncio
``_SelectorTransport`` unregisters fds it doesn't own", fix proposed in
https://github.com/python/cpython/pull/130142); openai declined to change the ``__del__``
(https://github.com/openai/openai-python/pull/3006, "in favor of explicit async client
cleanup"), which a user's agent may not do. The agent loop here applies the proposed fix to its
own socket transports: one finalized unclosed marks itself closed before its socket closes, so a
later ``close()``/``abort()`` from its resurrected owner is a no-op instead of touching a
descriptor that another connection now owns. ``benchmarks/agent_fd_reuse.py`` is the stress
test; ``tests/core/reliability/test_unclosed_clients.py`` replays the sequence step by step.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import warnings
from asyncio import selector_events
from typing import Any

__all__ = ["AgentEventLoop", "new_agent_loop"]

log = logging.getLogger(__name__)


class _SocketTransport(selector_events._SelectorSocketTransport):  # type: ignore[name-defined]  # private: not in typeshed
    """asyncio's socket transport, except that being finalized unclosed also marks it closed."""

    def __del__(self, _warn: Any = warnings.warn) -> None:
        if self._sock is not None and not self._conn_lost:
            # Unreachable, so no longer registered with the loop (a registration references it).
            # Its socket closes below and the descriptor number may be reused at once: from now
            # on close(), abort() and write() must not act on self._sock_fd.
            self._closing = True
            self._conn_lost += 1
            log.debug("an agent dropped a connection without closing it (fd %d); it was closed", self._sock_fd)
        super().__del__(_warn)


class AgentEventLoop(asyncio.SelectorEventLoop):
    """asyncio's selector event loop whose socket transports survive being dropped unclosed
    (module docstring)."""

    def _make_socket_transport(self, sock: Any, protocol: Any, waiter: Any = None, **kwargs: Any) -> Any:
        return _SocketTransport(self, sock, protocol, waiter, **kwargs)


def new_agent_loop() -> asyncio.AbstractEventLoop:
    """A new event loop for agents: an :class:`AgentEventLoop` under asyncio's default policy on
    POSIX; otherwise (another policy installed, e.g. uvloop's, or Windows) what the policy makes."""
    if sys.platform != "win32" and type(asyncio.get_event_loop_policy()) is asyncio.DefaultEventLoopPolicy:
        return AgentEventLoop()
    return asyncio.new_event_loop()
