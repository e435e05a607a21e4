"""Policies by role: one trained policy (a LoRA adapter on a shared base) per agent role.

- :mod:`.spec` — :class:`Policies`, :class:`PolicySpec` and :func:`match`: which agents each policy
  serves and how it is trained, declared once (``Trainer(policies=...)``, the CLI's ``--policy``);
- :mod:`.training` — :class:`PolicyLightningRL`: each policy's training rows from its own agents' calls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from .spec import BASE_POLICY, SHARED_POLICY, Policies, PolicySpec, match
    from .training import PolicyBatch, PolicyLightningRL

__all__ = ["BASE_POLICY", "SHARED_POLICY", "Policies", "PolicyBatch", "PolicyLightningRL", "PolicySpec", "match"]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        **dict.fromkeys(["BASE_POLICY", "SHARED_POLICY", "Policies", "PolicySpec", "match"], "spec"),
        **dict.fromkeys(["PolicyBatch", "PolicyLightningRL"], "training"),
    },
)
