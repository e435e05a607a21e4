"""agentbolt's own generator: the :class:`~agentbolt_torch.generation.engine.GenerationEngine`
served by the :class:`~agentbolt_torch.serving.server.PolicyServer`, in this process, as a
:class:`~agentbolt_torch.generation.generator.Generator`.

The engine samples from the very parameters the updater trains (:class:`~agentbolt_torch.policy.Policy`
is shared in-process), so synchronous weight sync is a pause: nothing is copied. Asynchronous
training serves a copy of the trainable weights (:mod:`agentbolt_torch.generation.serving_copy`)
and swaps the updated ones in. Per-role LoRA adapters are the policy's (``Policy(adapters=...)``),
each served under its own name.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..generation.engine import GenerationEngine
from ..generation.engine_io import EngineStats
from ..generation.serving_copy import SwapResult
from .server import PolicyServer

if TYPE_CHECKING:
    from ..policy import Policy

__all__ = ["LocalGenerator"]

log = logging.getLogger(__name__)


class LocalGenerator:
    """agentbolt's engine and policy server as one :class:`~agentbolt_torch.generation.generator.Generator`.

    Args:
        policy: the policy being trained (shared with the updater).
        seed: the engine's sampling seed.
        host, port: where the server listens (``port=0``: a free port).
        **engine: other keyword arguments of :class:`~agentbolt_torch.generation.engine.GenerationEngine`.
    """

    def __init__(self, policy: Policy, *, seed: int = 0, host: str = "127.0.0.1", port: int = 0, **engine: Any) -> None:
        self.policy = policy
        self.engine = GenerationEngine(policy, seed=seed, **engine)
        self.server = PolicyServer(self.engine, host=host, port=port, served_model_name=policy.name)

    @property
    def base_url(self) -> str:
        return self.server.base_url

    @property
    def served_model_name(self) -> str:
        return str(self.policy.name)

    def start(self) -> str:
        self.server.start()
        log.info("policy server for %s at %s", self.policy.name, self.server.base_url)
        return self.server.base_url

    def stop(self) -> None:
        self.server.stop()
        self.engine.stop()

    def pause(self, *, drain: bool = True, timeout: float | None = None) -> None:
        self.engine.pause(drain=drain, timeout=timeout)

    def resume(self) -> None:
        self.engine.resume()

    def serve_copy(self) -> Any:
        return self.engine.serve_copy()

    def swap_weights(self, *, drain: bool = True, timeout: float | None = None) -> SwapResult:
        return self.engine.swap_weights(drain=drain, timeout=timeout)

    @property
    def stats(self) -> EngineStats:
        return self.engine.stats

    def state(self) -> dict[str, Any]:
        return self.engine.state()
