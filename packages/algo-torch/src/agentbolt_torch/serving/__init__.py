"""Serving: the OpenAI-compatible HTTP server over a generation engine (:mod:`.server`) and its
routes (:mod:`.openai_routes`: chat completions, completions, Responses, Messages)."""

from __future__ import annotations

from agentbolt._lazy import lazy_exports

__all__ = ["PolicyServer"]

__getattr__, __dir__ = lazy_exports(__name__, {"PolicyServer": "server"})
