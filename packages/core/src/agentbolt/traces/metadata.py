"""The rollout metadata keys trace ingestion (:mod:`.ingest`) sets on every rollout it builds.

Constants only, so readers of traced rollouts (the exports: :mod:`agentbolt.runs.chat_calls`)
import them without the ingestor, the store or the receivers."""

from __future__ import annotations

__all__ = ["META_GROUP", "META_KEY", "META_SOURCE", "SOURCE_TRACE"]

META_SOURCE = "agentbolt.source"
"""Rollout metadata: :data:`SOURCE_TRACE` on every rollout built from traces."""
SOURCE_TRACE = "trace"
"""The :data:`META_SOURCE` value of a rollout built from traces."""
META_KEY = "agentbolt.trace.key"
"""Rollout metadata: the trace id (or session value) the rollout was built from."""
META_GROUP = "agentbolt.trace.group"
"""Rollout metadata: ``trace`` or ``session``."""
