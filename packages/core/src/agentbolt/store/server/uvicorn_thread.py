"""uvicorn on a background thread: the one way agentbolt runs an ASGI app beside other work
(the store server's :class:`~agentbolt.store.server.ServerThread`, agentbolt-torch's policy server,
the dashboard in tests).

Example::

    sock = socket.create_server(("127.0.0.1", 0))
    thread = UvicornThread(uvicorn.Server(uvicorn.Config(app, lifespan="off")), sock, name="my-app")
    thread.start()   # returns once the socket accepts connections
    ...
    thread.stop()

Importing it is cheap: uvicorn is imported by the caller that builds the server.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

__all__ = ["UvicornThread"]


class UvicornThread:
    """Serves ``server`` (a ``uvicorn.Server``) on the bound socket ``sock`` from a daemon thread."""

    def __init__(self, server: Any, sock: socket.socket, *, name: str) -> None:
        self.server = server
        """The ``uvicorn.Server``."""
        self.sock = sock
        self.name = name
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        """Whether the thread was started and has not been stopped."""
        return self._thread is not None

    def start(self, timeout: float = 30.0) -> None:
        """Start serving; returns once uvicorn has started. Raises ``RuntimeError`` (after
        stopping what it started) when the thread dies or ``timeout`` passes first."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, name=self.name, daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.name} did not start on {self.sock.getsockname()}; see the log")
            time.sleep(0.005)

    def stop(self, timeout: float = 30.0) -> None:
        """Ask uvicorn to exit and join the thread (at most ``timeout`` seconds)."""
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
