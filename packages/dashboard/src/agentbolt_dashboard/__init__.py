"""agentbolt-dashboard: a read-only web console over any agentbolt store (runs, rollouts,
trajectory replay, reward debugging, queue health, ``agentbolt serve``'s sessions and versions), served by ``agentbolt dashboard``.
See :func:`agentbolt_dashboard.app.create_app`."""

from __future__ import annotations

from .app import create_app

__all__ = ["create_app"]
