"""agentbolt-reinforce: an example algorithm plugin (REINFORCE with a moving-average baseline).

Importing this package is cheap: torch loads when the algorithm runs.
"""

from __future__ import annotations

from .reinforce import Reinforce, ReinforceResult

__all__ = ["Reinforce", "ReinforceResult"]
