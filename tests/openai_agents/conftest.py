"""The OpenAI Agents SDK exports traces to OpenAI by default. Tests never reach the network:
the SDK's default processor (its exporter) is removed here, in test setup only, with the SDK's
documented ``set_trace_processors``. ``OPENAI_AGENTS_DISABLE_TRACING`` would not do: it turns
off tracing itself, and with it the adapter (which refuses to instrument then)."""

from __future__ import annotations

import pytest

pytest.importorskip("agents", reason="openai-agents is not installed (pip install agentbolt-openai-agents)")

from agents.tracing import set_trace_processors

set_trace_processors([])
