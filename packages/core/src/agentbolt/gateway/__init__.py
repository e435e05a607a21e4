"""The OpenAI-compatible gateway that records exact token ids for every LLM call.

from agentbolt.gateway import Gateway, GatewayThread

gateway = Gateway(store, ["http://127.0.0.1:8000/v1"])
await gateway.start()                       # on the current event loop
base_url = gateway.base_url_for(rollout_id, attempt_id)

with GatewayThread("sqlite:///runs.db", ["http://127.0.0.1:8000/v1"]) as gw:   # own thread
    ...

async with GatewayClient("http://127.0.0.1:4800") as gw:   # one in another process
    await gw.pause()
"""

from __future__ import annotations

from .client import GatewayClient, GatewayControlError
from .gateway import Gateway, Upstream
from .relay import UPSTREAM_ERROR
from .thread import GatewayThread

__all__ = ["UPSTREAM_ERROR", "Gateway", "GatewayClient", "GatewayControlError", "GatewayThread", "Upstream"]
