"""The store server: the :class:`~agentbolt.store.Store` protocol over HTTP, plus OTLP ingest.

Run it with ``agentbolt store serve --store sqlite:///runs.db --port 4747`` and open it from
any machine with ``open_store("http://host:4747")``; agents in any language can send spans
to ``/v1/traces`` with a standard OTLP/HTTP exporter. From Python::

    from agentbolt.store.server import ServerThread, create_app, serve

    app = create_app(store, token="s3cret")       # an ASGI app for any server
    with ServerThread(store) as server:           # on a background thread (tests)
        print(server.url)
    serve("sqlite:///runs.db", port=4747)         # blocking, like the CLI

The wire format lives in :mod:`agentbolt.store.wire` (importing it does not import FastAPI).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..._lazy import lazy_exports

if TYPE_CHECKING:
    from .app import create_app
    from .run import DEFAULT_PORT, ServerThread, serve

__all__ = ["DEFAULT_PORT", "ServerThread", "create_app", "serve"]

# FastAPI and uvicorn are imported on first use, so clients importing the wire format stay light.
__getattr__, __dir__ = lazy_exports(
    __name__, {"create_app": "app", "DEFAULT_PORT": "run", "ServerThread": "run", "serve": "run"}
)
