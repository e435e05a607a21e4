"""Control a gateway that runs in another process (``agentbolt gateway serve``) over HTTP.

    from agentbolt.gateway import GatewayClient

    async with GatewayClient("http://127.0.0.1:4800", token="secret") as gw:
        await gw.set_upstreams(["http://10.0.0.5:8000/v1"])
        await gw.pause()
        drained = await gw.drain(timeout=60)
        ...                         # update the weights
        await gw.set_policy(version=7)
        await gw.resume()

It speaks the gateway's ``/gateway/*`` control routes and has the method names of
:class:`~agentbolt.gateway.Gateway`, so a trainer can drive an in-process gateway or a remote
one alike (the verl binding names ``agentbolt.gateway:GatewayClient`` as its control).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from ..errors import UserError
from .gateway import Upstream

__all__ = ["GatewayClient", "GatewayControlError"]


class GatewayControlError(UserError):
    """The gateway refused or failed a control call; the message carries its answer."""


class GatewayClient:
    """HTTP client of a gateway's control routes.

    Args:
        url: the gateway's address, ``http://host:port`` (a trailing ``/v1`` is accepted and
            ignored, so the URL agents use works too).
        token: the gateway's bearer token; defaults to ``$AGENTBOLT_GATEWAY_TOKEN`` (the
            variable ``agentbolt gateway serve`` reads), if set.
        timeout: seconds per control call; :meth:`drain` adds its own wait on top.
    """

    def __init__(self, url: str, *, token: str | None = None, timeout: float = 30.0) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise UserError(f"the gateway URL must start with http:// or https://, got {url!r}")
        root = url.rstrip("/")
        if root.endswith("/v1"):
            root = root[: -len("/v1")]
        self.url = root
        self._timeout = timeout
        token = token if token is not None else os.environ.get("AGENTBOLT_GATEWAY_TOKEN")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.AsyncClient(base_url=root, headers=headers, timeout=timeout)

    async def __aenter__(self) -> GatewayClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _call(self, route: str, body: Mapping[str, Any] | None = None, *, wait: float | None = 0.0) -> Any:
        """POST ``body`` to ``/gateway/{route}`` (GET when there is no body to send, for the
        read-only routes); ``wait`` is extra time the gateway may take (``None``: unbounded)."""
        try:
            if body is None:
                response = await self._http.get(f"/gateway/{route}")
            else:
                response = await self._http.post(
                    f"/gateway/{route}", json=dict(body), timeout=None if wait is None else self._timeout + wait
                )
        except httpx.HTTPError as exc:
            raise GatewayControlError(
                f"cannot reach the gateway at {self.url} ({type(exc).__name__}: {exc}); "
                "is `agentbolt gateway serve` running there?"
            ) from exc
        if response.status_code != 200:
            try:
                message = response.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = response.text[:500]
            raise GatewayControlError(f"gateway {self.url} /gateway/{route}: {response.status_code} {message}")
        return response.json()

    async def health(self) -> dict[str, Any]:
        """``{"status": "ok", "paused": bool}``; needs no token."""
        return await self._call("health")

    async def stats(self) -> dict[str, Any]:
        """Counters: requests, calls in flight, upstreams, paused, policy version, ..."""
        return await self._call("stats")

    async def set_upstreams(self, upstreams: Sequence[str | Upstream]) -> None:
        """Forward to these OpenAI-compatible base URLs (``…/v1``), replacing the previous ones."""
        items = [dataclasses.asdict(Upstream.of(u)) for u in upstreams]
        await self._call("upstreams", {"upstreams": items})

    async def pause(self) -> None:
        """New calls wait (bounded, then 503 with Retry-After) until :meth:`resume`."""
        await self._call("pause", {})

    async def resume(self) -> None:
        await self._call("resume", {})

    async def drain(self, timeout: float | None = None) -> bool:
        """Wait until no call is in flight upstream; ``True`` if that happened within ``timeout``."""
        answer = await self._call("drain", {"timeout": timeout}, wait=timeout)
        return bool(answer.get("drained"))

    async def flush(self) -> None:
        """Write the spans the gateway still buffers to its store."""
        await self._call("flush", {})

    async def set_policy(
        self,
        *,
        version: int | None = None,
        sampling: Mapping[str, Any] | None = None,
        model: str | None = None,
    ) -> None:
        """Policy version recorded on spans, sampling parameters and model name forced on calls."""
        await self._call(
            "policy", {"version": version, "sampling": dict(sampling) if sampling else None, "model": model}
        )
