"""agentbolt-apo: automatic prompt optimization (``Trainer(agent, algorithm="apo", ...)``).

Beam search over versions of one prompt of the resources (``resources.prompts["system"]`` by
default), edited by an optimizer LLM from critiques of the prompt's failures ("textual
gradients"), kept by held-out score. See :mod:`agentbolt_apo.algorithm` and docs/apo.md.

Importing this package is cheap; the algorithm loads when a name below is first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentbolt._lazy import lazy_exports

if TYPE_CHECKING:
    from .algorithm import APO
    from .result import APOResult, PromptVersion

__all__ = ["APO", "APOResult", "PromptVersion"]

__getattr__, __dir__ = lazy_exports(__name__, {"APO": "algorithm", "APOResult": "result", "PromptVersion": "result"})
