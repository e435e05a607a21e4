"""Plugins (pluggy): the registration hooks, the plugin manager and agentbolt's built-ins.

- :mod:`~agentbolt.plugins.hookspecs` — the five ``agentbolt_register_*`` hooks,
  :data:`hookimpl` (also ``from agentbolt import hookimpl``) and :class:`Register`;
- :mod:`~agentbolt.plugins.registry` — the plugin manager (:func:`default_plugins`,
  :class:`Plugins`): entry-point discovery, isolation of broken plugins, the registries.

Core's own implementations register through the same hooks, from the part they belong to:
:mod:`agentbolt.store.plugin` (store backends) and :mod:`agentbolt.lightningrl.plugin` (credit
assigners, advantage estimators); the registry loads them by module name.
"""

from __future__ import annotations

from . import registry
from .hookspecs import Register, hookimpl, hookspec
from .registry import *  # noqa: F403  # the package's API is the registry's, plus the hooks

__all__ = ["Register", "hookimpl", "hookspec", *registry.__all__]
