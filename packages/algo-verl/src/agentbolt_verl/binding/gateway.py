"""What the binding needs from agentbolt's gateway, and how it finds one.

The gateway is an OpenAI-compatible proxy in front of verl's vLLM replicas (see DESIGN §5).
The trainer drives it through this small interface: point it at the replicas' OpenAI servers,
and hold new calls while the replicas sleep for a weight update. A control that also has
``set_policy(version=)`` (agentbolt's ``GatewayClient`` does) is told the resources version after
each weight update, so every call's span records the version that served it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from agentbolt.errors import UserError
from agentbolt.runners.runner import import_reference

__all__ = ["GatewayControl", "load_object", "make_gateway_control", "upstream_urls"]


@runtime_checkable
class GatewayControl(Protocol):
    """Control surface of the gateway, as the verl binding uses it. All methods are coroutines."""

    async def set_upstreams(self, urls: Sequence[str]) -> None:
        """Forward calls to these OpenAI-compatible base URLs (each ends in ``/v1``), replacing
        the previous ones. Sticky routing by rollout id is the gateway's business."""
        ...

    async def pause(self) -> None:
        """Stop forwarding new calls: they wait (bounded) instead of failing. Returns at once."""
        ...

    async def resume(self) -> None:
        """Forward calls again, including those that waited."""
        ...

    async def drain(self, timeout: float | None = None) -> bool:
        """Wait until no call is in flight upstream; ``True`` if that happened within ``timeout``."""
        ...


def upstream_urls(addresses: Sequence[str]) -> list[str]:
    """verl's replica addresses (``LLMServerManager.get_addresses()``: ``host:port``, IPv6
    hosts in brackets) as OpenAI base URLs ``http://host:port/v1``."""
    out = []
    for address in addresses:
        address = str(address).strip().rstrip("/")
        if not address:
            raise UserError("empty replica address")
        if "://" not in address:
            address = f"http://{address}"
        if not address.endswith("/v1"):
            address = f"{address}/v1"
        out.append(address)
    return out


def load_object(spec: str) -> Any:
    """Import ``module:attr`` (or ``module.attr``)."""
    if not isinstance(spec, str) or not spec:
        raise UserError(f"expected 'module:attribute', got {spec!r}")
    if ":" not in spec:
        module_name, _, attr = spec.rpartition(".")
        spec = f"{module_name}:{attr}"
    return import_reference(spec, "callable")


def make_gateway_control(spec: str | None, *, url: str | None) -> GatewayControl:
    """Build the gateway control named by ``agentbolt.gateway.control`` (called with ``url=``)."""
    if spec is None:
        raise UserError(
            "agentbolt.gateway.control is not set: name a 'module:callable' that returns the gateway's "
            "control object (set_upstreams/pause/resume/drain), called with url=<agentbolt.gateway.url>"
        )
    control = load_object(spec)(url=url)
    missing = [m for m in ("set_upstreams", "pause", "resume", "drain") if not callable(getattr(control, m, None))]
    if missing:
        raise UserError(f"{spec!r} returned {type(control).__name__}, which lacks {', '.join(missing)}")
    return control
