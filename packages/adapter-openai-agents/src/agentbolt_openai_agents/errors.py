"""What the OpenAI Agents SDK adapter tells its users (imported by the adapter and its processor)."""

from __future__ import annotations

from agentbolt.errors import UserError

__all__ = ["CaptureOffError", "CaptureWarning"]


class CaptureOffError(UserError):
    """The Agents SDK is configured, process-wide, to record nothing useful (tracing disabled, or
    sensitive data excluded): the adapter refuses to instrument rather than record empty spans."""


class CaptureWarning(UserWarning):
    """A run inside a rollout records less than the adapter needs (its ``RunConfig`` turned
    tracing or sensitive data off, or the adapter's processor was removed from the SDK)."""
