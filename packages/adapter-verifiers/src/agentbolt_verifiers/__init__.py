"""agentbolt-verifiers: train on verifiers environments, and offer an agentbolt agent as one.

- :mod:`.environment`: a verifiers environment as agentbolt tasks (:func:`tasks`) and the agent
  that plays them (:class:`VerifiersAgent`); ``Trainer`` takes the environment object itself, or
  ``"verifiers://NAME"`` for an installed environment package.
- :mod:`.export`: an agentbolt agent and its tasks as a verifiers environment (a taskset, a
  harness that runs the agent, and the env that pairs them), for ``vf-eval`` and other trainers.

Importing this package is cheap (the plugin entry module, :mod:`.plugin`, imports it); verifiers
loads when a name below is first used.
"""

from __future__ import annotations

from agentbolt._lazy import lazy_exports
from agentbolt.plugins import distribution_version

__version__ = distribution_version("agentbolt-verifiers")

__all__ = [
    "VerifiersAgent",
    "VerifiersEpisodeError",
    "__version__",
    "episode_reward",
    "export_environment",
    "load_environment",
    "parse_reference",
    "tasks",
]

_LAZY = {
    "VerifiersAgent": "environment",
    "VerifiersEpisodeError": "environment",
    "episode_reward": "environment",
    "load_environment": "environment",
    "parse_reference": "environment",
    "tasks": "environment",
    "export_environment": "export",
}
"""Imported when first used: the plugin entry module (:mod:`.plugin`) imports this package, and every
store, runner and CLI command loads the plugins, so importing verifiers here would cost them all."""

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
