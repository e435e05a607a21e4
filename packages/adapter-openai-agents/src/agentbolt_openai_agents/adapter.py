"""The OpenAI Agents SDK adapter: a trace processor added next to the user's, translating SDK spans.

This module does not import ``agents``; :mod:`._processor` does, at ``instrument()``.

One process has one processor and one recorder, whatever the number of adapter instances:
every runner builds its own instance, and two instances must not record a unit twice. The
processor records while at least one instance is instrumented.
"""

from __future__ import annotations

import itertools
import threading
from typing import ClassVar

from agentbolt.adapters import Adapter, SpanRecorder
from agentbolt.errors import UserError

__all__ = ["CaptureOffError", "CaptureWarning", "OpenAIAgentsAdapter"]

NAME = "openai-agents"


class CaptureOffError(UserError):
    """The Agents SDK is configured, process-wide, to record nothing useful (tracing disabled, or
    sensitive data excluded): the adapter refuses to instrument rather than record empty spans."""


class CaptureWarning(UserWarning):
    """A run inside a rollout records less than the adapter needs (its ``RunConfig`` turned
    tracing or sensitive data off, or the adapter's processor was removed from the SDK)."""


class _Shared:
    """State shared by every adapter instance of the process."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.recorder = SpanRecorder(NAME)
        self.users: set[int] = set()
        """Tokens of the instrumented adapter instances."""
        self.active = False
        """Read without the lock on every SDK callback (a plain attribute read is atomic)."""
        self.processor: object | None = None


SHARED = _Shared()
_TOKENS = itertools.count()


class OpenAIAgentsAdapter(Adapter):
    """Records OpenAI Agents SDK runs inside rollouts as agentbolt spans.

    ``instrument()`` adds one trace processor with ``agents.tracing.add_trace_processor`` (the
    SDK's own processors and exporter, and the user's, keep receiving everything) and raises
    :class:`CaptureOffError` when tracing or sensitive-data capture is off for the whole process.
    It is idempotent, also across instances: all instances share one processor and one recorder.
    """

    name: ClassVar[str] = NAME
    distribution: ClassVar[str] = "openai-agents"
    supported: ClassVar[str] = ">=0.24,<0.25"

    def __init__(self) -> None:
        super().__init__()
        self.recorder = SHARED.recorder
        self._token = next(_TOKENS)

    def _instrument(self) -> None:
        from . import _processor

        _processor.check_capture_settings()
        with SHARED.lock:
            _processor.install(SHARED)
            SHARED.users.add(self._token)
            SHARED.active = True

    def _uninstrument(self) -> None:
        from . import _processor

        with SHARED.lock:
            SHARED.users.discard(self._token)
            if SHARED.users:
                return
            SHARED.active = False
            _processor.uninstall(SHARED)
            SHARED.recorder.discard_all()
