"""agentbolt-verifiers: train on verifiers environments, and offer an agentbolt agent as one.

- :mod:`.environment`: a verifiers environment as agentbolt tasks (:func:`tasks`) and the agent
  that plays them (:class:`VerifiersAgent`); ``Trainer`` takes the environment object itself, or
  ``"verifiers://NAME"`` for an installed environment package.
- :mod:`.export`: an agentbolt agent and its tasks as a verifiers environment (a taskset, a
  harness that runs the agent, and the env that pairs them), for ``vf-eval`` and other trainers.

Importing this package imports verifiers; the plugin entry module (:mod:`.plugin`) does not.
"""

from __future__ import annotations

from agentbolt.plugins import distribution_version

from .environment import (
    VerifiersAgent,
    VerifiersEpisodeError,
    episode_reward,
    load_environment,
    parse_reference,
    tasks,
)
from .export import export_environment

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
