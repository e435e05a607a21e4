"""The policy server: the OpenAI-compatible app of :mod:`agentbolt_torch.serving.openai_routes` (routes,
parameters, token ids and logprobs in vLLM's shapes) served by uvicorn on a background thread.

While a policy trains, the server can keep answering from a copy of its weights and swap the
new weights in at a version boundary: :meth:`PolicyServer.serve_copy` and
:meth:`PolicyServer.swap_weights` (:mod:`agentbolt_torch.generation.serving_copy`)."""

from __future__ import annotations

import logging
import socket
from typing import Any

from agentbolt.store.server.uvicorn_thread import UvicornThread

from ..generation.engine import GenerationEngine
from ..generation.serving_copy import ServingWeights, SwapResult
from .openai_routes import POLICY_NAME_HEADER, POLICY_VERSION_HEADER, create_app

__all__ = ["POLICY_NAME_HEADER", "POLICY_VERSION_HEADER", "PolicyServer", "create_app"]

logger = logging.getLogger(__name__)


class PolicyServer:
    """Runs the policy server (uvicorn) in a background thread on ``host:port``.

    ``port=0`` picks a free port; :attr:`base_url` is the OpenAI base URL (``.../v1``). Starting
    the server starts the engine if needed; stopping it stops the engine only if it started it.

    Example::

        policy = Policy.load("smollm2")
        with PolicyServer(GenerationEngine(policy)) as server:
            client = openai.OpenAI(base_url=server.base_url, api_key="none")
    """

    def __init__(
        self,
        engine: GenerationEngine,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        served_model_name: str | None = None,
        log_level: str = "warning",
    ) -> None:
        self.engine = engine
        self.host = host
        self.port = port
        self.app = create_app(engine, served_model_name=served_model_name)
        self.log_level = log_level
        self._thread: UvicornThread | None = None
        self._owns_engine = False

    @property
    def url(self) -> str:
        """``http://host:port``."""
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI base URL: ``http://host:port/v1``."""
        return f"{self.url}/v1"

    def start(self, timeout: float = 30.0) -> PolicyServer:
        """Start serving (returns once the socket accepts connections)."""
        import uvicorn

        if self._thread is not None:
            return self
        if self.engine._thread is None:
            self.engine.start()
            self._owns_engine = True
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app, log_level=self.log_level, access_log=False, lifespan="off", timeout_graceful_shutdown=5
        )
        self._thread = UvicornThread(uvicorn.Server(config), sock, name="agentbolt-policy-server")
        self._thread.start(timeout)
        logger.info("policy server on %s (model %r)", self.base_url, self.engine.policy.name)
        return self

    def stop(self) -> None:
        """Stop serving (and the engine, if :meth:`start` started it)."""
        if self._thread is not None:
            self._thread.stop(10)
            self._thread = None
        if self._owns_engine:
            self.engine.stop()
            self._owns_engine = False

    def paused(self, *, drain: bool = True, timeout: float | None = None) -> Any:
        """``with server.paused(): updater.update(...)`` (see :meth:`GenerationEngine.paused`):
        requests arriving meanwhile wait instead of failing."""
        return self.engine.paused(drain=drain, timeout=timeout)

    def serve_copy(self) -> ServingWeights:
        """Answer calls from a copy of the policy's weights from now on, so the policy can train
        while the server keeps serving (:meth:`GenerationEngine.serve_copy`)."""
        return self.engine.serve_copy()

    def swap_weights(self, *, drain: bool = True, timeout: float | None = None) -> SwapResult:
        """Serve the policy's current weights and version from now on (after :meth:`serve_copy`):
        with ``drain=True`` the calls in flight finish on the old weights first, with ``False``
        they continue on the new ones; calls arriving meanwhile wait. See
        :meth:`GenerationEngine.swap_weights` and :mod:`agentbolt_torch.generation.serving_copy`.

        Example (train while serving, then swap)::

            server.serve_copy()
            metrics = updater.update(rows)  # the server keeps answering from the copy
            server.swap_weights()           # now it answers from the updated weights
        """
        return self.engine.swap_weights(drain=drain, timeout=timeout)

    def __enter__(self) -> PolicyServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
