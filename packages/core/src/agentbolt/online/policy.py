"""What ``agentbolt serve`` needs from the model it serves and trains: :class:`OnlinePolicy`.

A backend keeps three things apart, so that training and the gate never touch what live
clients are being answered with:

- the **live slot**: an OpenAI-compatible server the gateway forwards live calls to;
- the **standby slot**: a second server, idle, where a candidate is loaded and evaluated by
  the gate before it goes live;
- the **training copy**: the weights (and optimizer) updates apply to.

A swap is then a change of upstream at the gateway (new calls go to the standby slot at once,
nothing waits) followed by a drain of the former live slot, which becomes the standby. The
methods are synchronous (they run on a worker thread), called one at a time in this order:
``start``, then per update ``train``, ``stage``, and either ``save``, ``promote``, ``release``
(the candidate goes live) or ``revert`` (it stays out); ``stop``.

Implementations:

- ``agentbolt_torch.training.online.TorchOnlinePolicy`` (agentbolt-torch): a real model, trained by
  agentbolt-torch's updater, the two slots being its policy server over copies of the trainable
  weights (``agentbolt serve --policy agentbolt_torch.training.online:smollm2``);
- :class:`agentbolt.testing.scripted_policy.ScriptedPolicy`: the contract over two fake LLM
  servers, whose "weights" are named reply functions (what core's tests train);
- :class:`StaticPolicy` serves a fixed upstream and trains nothing: ``agentbolt serve
  --upstream URL`` records sessions and feedback in front of any OpenAI-compatible server
  (vLLM, an API) for training elsewhere.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ..errors import UserError
from ..gateway import Upstream

__all__ = ["OnlinePolicy", "StaticPolicy"]


@runtime_checkable
class OnlinePolicy(Protocol):
    """A served and trained policy (see the module docstring)."""

    model: str
    """The model name the gateway forces into live requests."""
    trains: bool
    """False for a policy that only serves (no updates, no gate)."""

    def start(self, version: int, checkpoint: Path | None) -> Upstream:
        """Load the weights (``checkpoint``: the live version saved before a restart, ``None``:
        the initial weights) into every slot and the training copy, set their policy version to
        ``version`` and start serving; returns the live slot's upstream."""
        ...

    def train(self, rows: Sequence[Any]) -> Mapping[str, float]:
        """Update the training copy from LightningRL's training rows; returns metrics."""
        ...

    def stage(self, version: int) -> Upstream:
        """Load the training copy into the standby slot as policy ``version``; returns it."""
        ...

    def promote(self) -> Upstream:
        """The standby slot becomes live (the caller points the gateway at it); returns the
        former live slot's upstream, which becomes the standby once drained."""
        ...

    def release(self, timeout_s: float) -> None:
        """Wait (at most ``timeout_s``) until the former live slot has no request left."""
        ...

    def revert(self) -> None:
        """A candidate was rejected: the training copy goes back to the live weights."""
        ...

    def save(self, directory: Path) -> None:
        """Save the weights going live to ``directory`` (what :meth:`start` loads after a
        restart): the staged candidate (the server saves it just before :meth:`promote`), or the
        live weights when nothing is staged."""
        ...

    def stop(self) -> None:
        """Stop serving and free the model."""
        ...


class StaticPolicy:
    """A fixed OpenAI-compatible upstream, served as is: sessions and feedback are recorded,
    nothing is trained (for training elsewhere from the store)."""

    trains = False

    def __init__(self, upstream: Upstream | str, model: str | None = None) -> None:
        self.upstream = Upstream.of(upstream)
        if model is not None:
            self.upstream = Upstream(self.upstream.base_url, self.upstream.api_key, model)
        self.model = self.upstream.model or ""

    def start(self, version: int, checkpoint: Path | None) -> Upstream:
        return self.upstream

    def _no(self, *_: Any) -> Any:
        raise UserError("this served policy is a fixed upstream: it does not train (use agentbolt-torch's)")

    train = stage = _no

    def promote(self) -> Upstream:
        return self._no()

    def release(self, timeout_s: float) -> None:
        self._no()

    def revert(self) -> None:
        self._no()

    def save(self, directory: Path) -> None:
        pass

    def stop(self) -> None:
        pass
