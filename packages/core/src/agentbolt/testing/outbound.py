"""Refuse and record every network connection that would leave the machine.

What tests of instrumented agents use to show that nothing is sent outside the machine (an
SDK's cloud exporter, an update check, telemetry) unless the user configured it::

    with OutboundGuard() as guard:
        run_the_agent()
    assert guard.attempts == []

While active, ``socket.socket.connect``/``connect_ex`` to an address outside the loopback range
and ``socket.getaddrinfo`` of a name other than ``localhost`` raise ``OSError`` (as a machine
without a network would) and are recorded in :attr:`OutboundGuard.attempts`. Unix sockets and
loopback traffic (the gateway, the fake LLM, the store) pass. Process-wide while active; one
guard at a time.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from typing import Any

__all__ = ["OutboundGuard"]

_LOCAL_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


class OutboundGuard:
    """Context manager: refuse and record connections and name lookups that leave the machine."""

    def __init__(self) -> None:
        self.attempts: list[str] = []
        """``"connect HOST:PORT"`` / ``"resolve NAME"`` of each refused attempt, in order."""
        self._lock = threading.Lock()
        self._saved: tuple[Any, Any, Any] | None = None

    def __enter__(self) -> OutboundGuard:
        if self._saved is not None:
            raise RuntimeError("this OutboundGuard is already active")
        connect, connect_ex, getaddrinfo = socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo
        self._saved = (connect, connect_ex, getaddrinfo)
        guard = self

        def guarded_connect(sock: socket.socket, address: Any) -> Any:
            guard._check(sock, address)
            return connect(sock, address)

        def guarded_connect_ex(sock: socket.socket, address: Any) -> Any:
            guard._check(sock, address)
            return connect_ex(sock, address)

        def guarded_getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
            name = host.decode() if isinstance(host, bytes) else host
            if name is not None and not _local(str(name)):
                guard._refuse(f"resolve {name}")
            return getaddrinfo(host, *args, **kwargs)

        # Patching methods of a builtin class: typeshed types them on ``_socket.socket``.
        socket.socket.connect = guarded_connect  # type: ignore[method-assign,assignment]  # restored by __exit__
        socket.socket.connect_ex = guarded_connect_ex  # type: ignore[method-assign,assignment]  # restored by __exit__
        socket.getaddrinfo = guarded_getaddrinfo
        return self

    def __exit__(self, *exc: object) -> None:
        if self._saved is not None:
            socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo = self._saved  # type: ignore[method-assign]  # undoes __enter__'s patch
            self._saved = None

    def _check(self, sock: socket.socket, address: Any) -> None:
        if sock.family not in (socket.AF_INET, socket.AF_INET6) or not isinstance(address, tuple):
            return
        if not _local(str(address[0])):
            self._refuse(f"connect {address[0]}:{address[1]}")

    def _refuse(self, what: str) -> None:
        with self._lock:
            self.attempts.append(what)
        raise OSError(f"agentbolt.testing.outbound: refused {what} (nothing may leave the machine)")


def _local(host: str) -> bool:
    if host in _LOCAL_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False
