"""What the AutoGen adapter tells its users (imported by the adapter and its hooks)."""

from __future__ import annotations

__all__ = ["AutogenCaptureWarning"]


class AutogenCaptureWarning(UserWarning):
    """Something AutoGen reported cannot be captured completely (logged once per kind)."""
