"""Environments given as the agent: an environment object of another framework (a verifiers
environment, ...) or ``"KIND://NAME"`` (an installed environment package), resolved to the
agentbolt agent that runs it.

Plugins register environment kinds through ``agentbolt_register_environments``; a kind has
``accepts(obj) -> bool`` and ``agent(obj_or_name) -> agent``. Core knows none of them: it asks
each kind whether it accepts an object that is neither a function nor has a ``rollout`` method,
and hands a ``"KIND://NAME"`` string to the kind registered under ``KIND``::

    Trainer(vf_env)                        # agentbolt-verifiers accepts a verifiers.v1 Env
    Trainer("verifiers://reverse-text")    # the installed verifiers environment 'reverse-text'
"""

from __future__ import annotations

from typing import Any

from .errors import UserError
from .plugins.registry import default_plugins

__all__ = ["environment_agent", "is_environment_reference"]

SEPARATOR = "://"


def is_environment_reference(agent: Any) -> bool:
    """Whether ``agent`` is a ``"KIND://NAME"`` string naming an environment package."""
    return isinstance(agent, str) and SEPARATOR in agent


def environment_agent(agent: Any) -> Any | None:
    """The agent that runs the environment ``agent`` names or is; ``None`` when no registered
    environment kind accepts the object. A ``"KIND://NAME"`` string with an unknown ``KIND``
    raises a :class:`~agentbolt.errors.UserError` listing the known kinds (and the package that
    brings a first-party one)."""
    kinds = default_plugins().environments
    if is_environment_reference(agent):
        kind, _, name = str(agent).partition(SEPARATOR)
        if not name:
            raise UserError(f"environment reference {agent!r} names no environment: write '{kind}://NAME'")
        return kinds.get(kind).agent(name)
    for entry in kinds:
        if entry.value.accepts(agent):
            return entry.value.agent(agent)
    return None
