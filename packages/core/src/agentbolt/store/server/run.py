"""Running the store server: in the foreground (``agentbolt store serve``) or on a thread."""

from __future__ import annotations

import gc
import ipaddress
import logging
import socket
from collections.abc import Callable
from types import TracebackType
from typing import Any, Self

import uvicorn

from ...errors import UserError
from ...hosts import is_loopback_name
from .. import open_store
from ..base import Store
from .app import DEFAULT_MAX_REQUEST_BYTES, DEFAULT_MAX_WAIT_S, create_app
from .uvicorn_thread import UvicornThread

__all__ = ["DEFAULT_PORT", "ServerThread", "check_bind", "is_loopback", "serve"]

log = logging.getLogger(__name__)

DEFAULT_PORT = 4747
"""Port of ``agentbolt store serve`` unless ``--port`` says otherwise."""


def is_loopback(host: str) -> bool:
    """True when ``host`` only reaches this machine (``127.0.0.0/8``, ``::1``, ``localhost``)."""
    host = host.strip("[]")
    if is_loopback_name(host.lower()):
        return True
    try:  # a host name: loopback only if every address it resolves to is
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0]).is_loopback for info in infos)


def check_bind(host: str, token: str | None) -> None:
    """Refuse to serve beyond this machine without a token (:class:`~agentbolt.errors.UserError`)."""
    if not token and not is_loopback(host):
        raise UserError(
            f"refusing to serve the store on {host!r} without a token: anyone who can reach that address "
            "could read and change every rollout. Pass --token (or set AGENTBOLT_STORE_TOKEN) and give "
            "clients the same token, or bind to 127.0.0.1."
        )


def serve(
    store_url: str,
    *,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    token: str | None = None,
    max_wait_s: float = DEFAULT_MAX_WAIT_S,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    access_log: bool = False,
    store_options: dict[str, Any] | None = None,
) -> None:
    """Serve the store at ``store_url`` until interrupted (Ctrl+C / SIGTERM); blocks.

    Meant to own its process, as ``agentbolt store serve`` does (it tunes the garbage collector
    for it); to serve from a process that does other work, use :class:`ServerThread`. A
    non-loopback ``host`` requires a ``token``. ``port=0`` picks a free port; the address is
    logged once the server accepts connections.
    """
    check_bind(host, token)
    sock = _bind(host, port)
    store = open_store(store_url, **(store_options or {}))
    app = create_app(store, token=token, max_wait_s=max_wait_s, max_request_bytes=max_request_bytes, close_store=True)
    url = _url(host, sock)

    def started() -> None:
        # This process is the server's alone: everything alive now (modules, the app, the store)
        # lives as long as it does. Freezing it keeps full garbage collections, which validating
        # large span batches triggers, from walking it again and again.
        gc.collect()
        gc.freeze()
        log.info(
            "agentbolt store server listening on %s (store %s%s); OpenAPI schema at %s/openapi.json",
            url,
            store.url,
            ", bearer token required" if token else "",
            url,
        )

    server = _Server(_config(app, access_log=access_log), app, on_started=started)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn re-raises Ctrl+C once it has shut down gracefully
        pass
    log.info("agentbolt store server on %s stopped", url)


class ServerThread:
    """A store server on a background thread: for tests, notebooks and embedding.

    Example::

        with ServerThread(open_store("memory://")) as server:
            store = open_store(server.url)

    The server does not close ``store`` unless ``close_store`` is set.
    """

    def __init__(
        self,
        store: Store,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        max_wait_s: float = DEFAULT_MAX_WAIT_S,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        close_store: bool = False,
    ) -> None:
        check_bind(host, token)
        self.store = store
        self._host = host
        self._port = port
        self._app = create_app(
            store, token=token, max_wait_s=max_wait_s, max_request_bytes=max_request_bytes, close_store=close_store
        )
        self._thread: UvicornThread | None = None
        self.url = ""
        """``http://host:port`` once started."""

    def start(self, timeout: float = 30.0) -> Self:
        """Start serving; returns once the server accepts connections."""
        sock = _bind(self._host, self._port)
        self.url = _url(self._host, sock)
        self._thread = UvicornThread(
            _Server(_config(self._app, access_log=False), self._app), sock, name="agentbolt-store-server"
        )
        self._thread.start(timeout)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Stop serving (waiting requests end at once) and join the thread."""
        if self._thread is not None:
            self._thread.stop(timeout)
            self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class _Server(uvicorn.Server):
    """uvicorn, ending the app's waiting requests as soon as shutdown begins."""

    def __init__(self, config: uvicorn.Config, app: Any, on_started: Callable[[], None] | None = None) -> None:
        super().__init__(config)
        self._waits = app.state.waits
        self._on_started = on_started

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and self._on_started is not None:
            self._on_started()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._waits.stopping.set()
        await super().shutdown(sockets)


def _config(app: Any, *, access_log: bool) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        log_config=None,  # the host application configures logging
        access_log=access_log,
        lifespan="on",
        ws="none",
        timeout_keep_alive=75,  # longer than clients keep idle connections, so reuse never races a close
        timeout_graceful_shutdown=10,
        server_header=False,
        proxy_headers=False,  # clients' addresses matter to no endpoint; saves work per request
    )


def _bind(host: str, port: int) -> socket.socket:
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise UserError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; check --host") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise UserError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}; choose another --host/--port"
        ) from None
    sock.set_inheritable(True)
    return sock


def _url(host: str, sock: socket.socket) -> str:
    port = sock.getsockname()[1]
    host = host.strip("[]")
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
