"""agentbolt-verl: train agentbolt agents with verl 0.9.1 (vLLM rollout, FSDP update).

Importing this package is cheap and works without verl: verl is imported only by the modules
that need it (:mod:`.to_verl`, :mod:`.losses`, :mod:`.registry` and the binding's
:mod:`.binding.agent_loop` / :mod:`.binding.trainer`), each behind the exact-version check of
:func:`check_verl_version`.

Every training signal is LightningRL's (``agentbolt.lightningrl``, the ``agentbolt.lightningrl``
section of the config): this package packs and moves it. Layers:

1. :mod:`.batch`: transitions → padded tensors with verl's batch keys (numpy/torch only);
   :mod:`.columns`: LightningRL's advantages and loss weights as verl's batch columns.
2. :mod:`.to_verl`, :mod:`.losses`: ``DataProto`` conversion, and the one policy loss
   (``agentbolt``: PPO-clip times LightningRL's loss weight), registered in verl's registry.
3. :mod:`.binding`: verl's V1 trainers (sync and ``colocate_async``) with an agent loop that runs
   each session as an agentbolt rollout. :mod:`.config` composes verl's Hydra config with ours.
"""

from __future__ import annotations

from agentbolt.plugins import distribution_version

from ._verl import REQUIRED_VERL_VERSION, VerlVersionError, check_verl_version

__version__ = distribution_version("agentbolt-verl")

__all__ = ["REQUIRED_VERL_VERSION", "VerlVersionError", "__version__", "check_verl_version"]
