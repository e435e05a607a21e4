"""Run a :class:`Gateway` on its own thread and event loop, controlled from synchronous code."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from ..store import open_store
from ..store.base import Store
from .gateway import Gateway, Upstream

__all__ = ["GatewayThread"]

R = TypeVar("R")


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - uvloop ships with uvicorn[standard]
        return asyncio.new_event_loop()


class GatewayThread:
    """A gateway serving from a background thread (uvloop when available).

    Args:
        store: a store URL (opened, and closed, inside the gateway's thread — required for the
            ``http://`` store, whose client belongs to one event loop) or a store object that
            is safe to use from another thread (memory, SQLite, PostgreSQL).
        upstreams: OpenAI-compatible endpoints.
        host, port: where to listen (port 0 picks a free port).
        **options: passed to :class:`Gateway`.
    """

    def __init__(
        self,
        store: Store | str,
        upstreams: Sequence[Upstream | str],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        **options: Any,
    ) -> None:
        self._store_spec = store
        self._upstreams = list(upstreams)
        self._host = host
        self._port = port
        self._options = options
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._gateway: Gateway | None = None
        self._stopped: asyncio.Event | None = None
        self._ready: concurrent.futures.Future[str] = concurrent.futures.Future()

    def start(self) -> str:
        """Start serving; returns the gateway's base URL."""
        if self._thread is not None:
            return self.url
        self._thread = threading.Thread(target=self._main, name="agentbolt-gateway", daemon=True)
        self._thread.start()
        return self._ready.result()

    def _main(self) -> None:
        loop = self._loop = _new_loop()
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._serve())
        finally:
            loop.close()

    async def _serve(self) -> None:
        own_store = isinstance(self._store_spec, str)
        try:
            store = open_store(self._store_spec) if isinstance(self._store_spec, str) else self._store_spec
            self._gateway = Gateway(store, self._upstreams, **self._options)
            self._stopped = asyncio.Event()
            url = await self._gateway.start(self._host, self._port)
        except BaseException as exc:
            self._ready.set_exception(exc)
            return
        self._ready.set_result(url)
        await self._stopped.wait()
        await self._gateway.stop()
        if own_store:
            await store.close()

    def stop(self) -> None:
        """Stop serving (pending spans are written first)."""
        if self._thread is None or self._loop is None or self._stopped is None:
            return
        self._loop.call_soon_threadsafe(self._stopped.set)
        self._thread.join(timeout=60)
        self._thread = None

    def __enter__(self) -> GatewayThread:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- thread-safe control ----------------------------------------------------------------------

    @property
    def gateway(self) -> Gateway:
        """The gateway object; touch it only from its own loop (use the methods below instead)."""
        if self._gateway is None:
            raise RuntimeError("the gateway thread is not started")
        return self._gateway

    @property
    def url(self) -> str:
        return self.gateway.url

    def base_url_for(self, rollout_id: str, attempt_id: str) -> str:
        return self.gateway.base_url_for(rollout_id, attempt_id)

    def _call(self, fn: Callable[[], R]) -> R:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(_wrap(fn), self._loop).result()

    def _await(self, coro_fn: Callable[[], Awaitable[R]], timeout: float | None = None) -> R:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(_await(coro_fn), self._loop).result(timeout)

    def pause(self) -> None:
        self._call(self.gateway.pause)

    def resume(self) -> None:
        self._call(self.gateway.resume)

    def drain(self, timeout: float | None = None) -> bool:
        return self._await(lambda: self.gateway.drain(timeout))

    def flush(self, timeout: float | None = 60.0) -> None:
        self._await(lambda: self.gateway.flush(timeout))

    def set_policy(
        self, *, version: int | None = None, sampling: Mapping[str, Any] | None = None, model: str | None = None
    ) -> None:
        self._call(lambda: self.gateway.set_policy(version=version, sampling=sampling, model=model))

    def set_upstreams(self, upstreams: Sequence[Upstream | str]) -> None:
        self._call(lambda: self.gateway.set_upstreams(upstreams))

    def stats(self) -> dict[str, Any]:
        return self._call(self.gateway.stats)

    async def async_flush(self, timeout: float | None = 60.0) -> None:
        """:meth:`flush` for callers on another event loop."""
        assert self._loop is not None
        await asyncio.wrap_future(
            asyncio.run_coroutine_threadsafe(_await(lambda: self.gateway.flush(timeout)), self._loop)
        )


async def _wrap(fn: Callable[[], R]) -> R:
    return fn()


async def _await(fn: Callable[[], Awaitable[R]]) -> R:
    return await fn()
