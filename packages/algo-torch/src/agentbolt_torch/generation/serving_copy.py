"""Serving weights: the copy of the policy that generation reads while the updater trains.

In asynchronous training (``LightningRLConfig.max_staleness`` set) the policy server keeps
answering calls while the updater trains. :meth:`GenerationEngine.serve_copy
<agentbolt_torch.generation.engine.GenerationEngine.serve_copy>` makes the engine forward through a
:class:`ServingWeights`: a second module that **shares the policy's frozen parameters** and
holds copies of its trainable ones (a full copy of the weights in full fine-tuning, only the
adapters with LoRA), with its own lock, version and weights-generation counter. The updater
trains the policy's own parameters under :attr:`Policy.lock <agentbolt_torch.policy.Policy.lock>`;
generation holds only the serving lock, so the two run at the same time.

The swap (:meth:`GenerationEngine.swap_weights <agentbolt_torch.generation.engine.GenerationEngine.swap_weights>`,
:meth:`PolicyServer.swap_weights <agentbolt_torch.serving.server.PolicyServer.swap_weights>`) copies the
policy's current trainable weights and version into the serving copy at a version boundary:

- ``drain=True``: admission pauses and the calls in flight finish first, so every call is
  sampled by one version; new calls wait (they are not refused) until the copy is done;
- ``drain=False`` (in place): the copy happens between two decode steps; calls in flight go on
  with the new weights (their KV cache holds the old ones' keys and values) and report the
  version they started with, the older one, so a staleness bound measured from it is
  conservative; each token's behaviour logprob is the one it was sampled with.

Memory: one extra copy of the trainable parameters (SmolLM2-135M in fp32: 0.54 GB; LoRA: the
adapters only). The copy is made once; each swap copies tensors in place (no allocation).
"""

from __future__ import annotations

import copy
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentbolt.errors import UserError

from ..adapters import BASE

if TYPE_CHECKING:
    import torch

    from ..policy import Policy

__all__ = ["ServingWeights", "SwapResult"]


@dataclass(frozen=True)
class SwapResult:
    """What one weight swap did."""

    version: int
    """The version served from now on."""
    previous_version: int
    """The version served before."""
    drain: bool
    """``True``: the calls in flight finished before the copy; ``False``: copied in place."""
    wait_s: float
    """Time from the swap request until generation stopped (draining, or the decode step in progress)."""
    copy_s: float
    """Time copying the weights (generation was stopped meanwhile)."""
    carried_rows: int
    """Sequences in flight that continue on the new weights (0 when draining)."""

    @property
    def paused_s(self) -> float:
        """How long generation did not run because of the swap."""
        return self.wait_s + self.copy_s if self.drain else self.copy_s


class ServingWeights:
    """A copy of ``policy``'s trainable parameters in a module sharing its frozen ones.

    Has what the engine reads from a :class:`~agentbolt_torch.policy.Policy` to generate:
    :attr:`model`, :attr:`lock`, :attr:`version` (:meth:`version_of` per adapter) and
    :attr:`weights_generation`.
    """

    def __init__(self, policy: Policy) -> None:
        with policy.lock:
            trainable = [(name, p) for name, p in policy.model.named_parameters() if p.requires_grad]
            if not trainable:
                raise UserError("the policy has no trainable parameters: there is nothing to serve a copy of")
            # Frozen parameters (a LoRA base, frozen embeddings) are shared, not copied.
            memo: dict[int, Any] = {id(p): p for p in policy.model.parameters() if not p.requires_grad}
            self.model: Any = copy.deepcopy(policy.model, memo)
            self.version = policy.version
            self._adapter_versions = {name: policy.version_of(name) for name in policy.adapters}
        self.model.eval()
        served = dict(self.model.named_parameters())
        self._pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        for name, source in trainable:
            target = served[name]
            target.requires_grad_(False)
            target.grad = None
            self._pairs.append((source, target))
        self.lock = threading.RLock()
        """Held by each generation forward pass and by the copy of a swap."""
        self.weights_generation = 0
        """Bumped by every :meth:`load_from` (generation caches depend on it)."""

    def version_of(self, adapter: str | None) -> int:
        """The served version for ``adapter``, as :meth:`Policy.version_of
        <agentbolt_torch.policy.Policy.version_of>` says it (as of the last copy)."""
        if adapter is None:
            return self.version
        if adapter == BASE:
            return 0
        return self._adapter_versions[adapter]

    @property
    def nbytes(self) -> int:
        """Memory held by the copied parameters."""
        return sum(t.numel() * t.element_size() for _, t in self._pairs)

    def load_from(self, policy: Policy) -> None:
        """Copy the policy's trainable weights and version here (in place; takes both locks:
        call it while generation is stopped, see :meth:`GenerationEngine.swap_weights
        <agentbolt_torch.generation.engine.GenerationEngine.swap_weights>`)."""
        import torch

        with policy.lock, self.lock, torch.no_grad():
            for source, target in self._pairs:
                target.copy_(source)
            self.version = policy.version
            self._adapter_versions = {name: policy.version_of(name) for name in policy.adapters}
            self.weights_generation += 1
