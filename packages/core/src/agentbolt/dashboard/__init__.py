"""``agentbolt dashboard``: a read-only web console over any store (runs, rollouts, trajectory
replay, reward debugging, queue health). See :func:`agentbolt.dashboard.app.create_app`."""

from __future__ import annotations

from .app import create_app

__all__ = ["create_app"]
