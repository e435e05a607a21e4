"""APO: automatic prompt optimization (``Trainer(algorithm="apo", ...)``).

Beam search over versions of one prompt of the resources (``resources.prompts["system"]`` by
default), edited by an optimizer LLM from critiques of the prompt's failures ("textual
gradients"), kept by held-out score. See :mod:`agentbolt.apo.algorithm` and docs/apo.md.
"""

from __future__ import annotations

from .algorithm import APO
from .result import APOResult, PromptVersion

__all__ = ["APO", "APOResult", "PromptVersion"]
