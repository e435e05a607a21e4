"""Test doubles for the store server tests."""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from agentbolt import types as t
from agentbolt.store.memory import MemoryStore


def specs(n: int, prefix: str = "r", **kwargs: Any) -> list[t.RolloutSpec]:
    return [t.RolloutSpec(rollout_id=f"{prefix}{i}", input={"i": i}, **kwargs) for i in range(n)]


class FaultyStore:
    """A memory store whose named methods raise queued exceptions first, counting calls."""

    def __init__(self, **faults: list[BaseException]) -> None:
        self.inner = MemoryStore(sweep_interval_s=0)
        self.url = "faulty://"
        self.faults = faults
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.inner, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            queued = self.faults.get(name)
            if queued:
                raise queued.pop(0)
            return await method(*args, **kwargs)

        return call


Action = Callable[[httpx.Request], Awaitable[None]] | None


class FaultyTransport(httpx.AsyncBaseTransport):
    """Forwards requests to the network, failing chosen ones once as a flaky network would.

    ``fail(path, how)``: ``refused`` (never sent), ``lost_request`` (sent, never applied),
    ``lost_answer`` (applied, answer lost). ``before`` runs first (e.g. to change the store).
    """

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.plan: list[tuple[str, str, Action]] = []
        self.paths: list[str] = []

    def fail(self, path: str, how: str, before: Action = None) -> None:
        assert how in ("refused", "lost_request", "lost_answer")
        self.plan.append((path, how, before))

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(request.url.path)
        for i, (path, how, before) in enumerate(self.plan):
            if request.url.path == path:
                del self.plan[i]
                if before is not None:
                    await before(request)
                if how == "refused":
                    raise httpx.ConnectError("injected: connection refused", request=request)
                if how == "lost_request":
                    raise httpx.ReadError("injected: connection reset", request=request)
                response = await self.inner.handle_async_request(request)
                await response.aread()
                await response.aclose()
                raise httpx.ReadError("injected: connection reset after the server answered", request=request)
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()
