"""Serving: the OpenAI-compatible HTTP server over a generation engine (:mod:`.server`), its
routes (:mod:`.openai_routes`: chat completions and completions with token ids and logprobs), and
agentbolt's own generator, engine and server together (:mod:`.local`)."""

from __future__ import annotations

from agentbolt._lazy import lazy_exports

__all__ = ["LocalGenerator", "PolicyServer"]

__getattr__, __dir__ = lazy_exports(__name__, {"LocalGenerator": "local", "PolicyServer": "server"})
