"""Registration of the built-in credit assigners and advantage estimators (being written)."""

from __future__ import annotations

from ..hookspecs import Register


def register_builtins(register: Register) -> None:
    """Register every built-in credit assigner and advantage estimator."""
