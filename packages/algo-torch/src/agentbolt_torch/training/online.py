"""A real model behind ``agentbolt serve``: :class:`TorchOnlinePolicy`, the
:class:`~agentbolt.online.OnlinePolicy` of agentbolt-torch.

    from agentbolt.online import OnlineServer, GateOptions
    from agentbolt_torch.training.online import TorchOnlinePolicy

    policy = TorchOnlinePolicy("smollm2", lora=LoraSettings(r=16), update=UpdateConfig(lr=1e-4))
    async with OnlineServer("sqlite:///serve.db", policy, gate=GateOptions(...)) as server:
        ...  # live clients call server.url; rewarded sessions train the policy in the background

From the command line: ``agentbolt serve --policy agentbolt_torch.training.online:smollm2`` (full
fine-tuning), ``agentbolt_torch.training.online:smollm2_lora`` (LoRA) or a function of your own returning a
:class:`TorchOnlinePolicy`.

One :class:`~agentbolt_torch.policy.Policy` is the **training copy**: a
:class:`~agentbolt_torch.update.updater.PolicyUpdater` trains its weights (on the server's worker
thread). Two **slots**, *live* and *standby*, each a :class:`~agentbolt_torch.generation.engine.GenerationEngine`
behind its own :class:`~agentbolt_torch.serving.server.PolicyServer` on 127.0.0.1, generate from a
:class:`~agentbolt_torch.generation.serving_copy.ServingWeights` copy of the trainable weights (frozen
parameters are shared): training never touches what a slot answers with, and a slot's weights
change only between two calls. Responses carry exact token ids, logprobs and the policy version
of the weights that sampled them, as the policy server gives them everywhere else.

- :meth:`~TorchOnlinePolicy.stage` copies the training copy into the standby slot with the
  candidate's version (the gate evaluates it there); :meth:`~TorchOnlinePolicy.promote` swaps
  the roles; :meth:`~TorchOnlinePolicy.release` waits until the former live slot has no call
  left, so the next :meth:`~TorchOnlinePolicy.stage` cannot change weights under a live call.
- :meth:`~TorchOnlinePolicy.revert` puts the training copy back to the live weights **and the
  optimizer back to its state before the rejected update** (see its docstring).
- :meth:`~TorchOnlinePolicy.save` / :meth:`~TorchOnlinePolicy.start` round-trip the version going
  live through :meth:`PolicyUpdater.save_checkpoint <agentbolt_torch.update.updater.PolicyUpdater.save_checkpoint>`'s
  format (the weights, or with LoRA only the adapter; the optimizer; the version).

Memory: the model once, **plus two copies of the trainable weights** (the slots), plus AdamW's
two moments of the trainable weights, plus a snapshot of those moments from an update until the
gate decides (what :meth:`~TorchOnlinePolicy.revert` restores). Full fine-tuning of
SmolLM2-135M in fp32: 0.54 GB of weights, 1.08 GB for the slots, 1.08 GB of moments and up to
1.08 GB of snapshot; with LoRA the copies, moments and snapshot are the adapters' only. Full
fine-tuning with ``UpdateConfig(kl_coef > 0)`` adds the updater's frozen reference copy of the
model (LoRA's reference is the base with the adapters off: free).
"""

from __future__ import annotations

import copy
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from agentbolt.errors import UserError
from agentbolt.gateway import Upstream
from agentbolt.lightningrl import DEFAULT_LOSS_AGGREGATION, LossAggregation

if TYPE_CHECKING:
    import torch

    from ..policy import LoraSettings, Policy
    from ..serving.server import PolicyServer
    from ..update.updater import PolicyUpdater, UpdateConfig

__all__ = ["TorchOnlinePolicy", "smollm2", "smollm2_lora", "tiny"]

log = logging.getLogger(__name__)

_State = Literal["clean", "trained", "staged"]
"""Where the training copy stands: ``clean`` = the live weights; ``trained`` = updated since,
not staged; ``staged`` = the candidate in the standby slot (not yet promoted or reverted)."""


class TorchOnlinePolicy:
    """A model of agentbolt-torch, served live and trained in the background by ``agentbolt serve``
    (see the module docstring).

    Args:
        model: ``"smollm2"``, ``"tiny"`` (a random model for tests) or a local Hugging Face
            directory (:meth:`Policy.load <agentbolt_torch.policy.Policy.load>`).
        lora: train LoRA adapters instead of every weight (needs ``agentbolt-torch[lora]``).
        update: the updater's hyper-parameters (:class:`~agentbolt_torch.update.updater.UpdateConfig`;
            LoRA usually wants ``lr=1e-4``).
        loss_aggregation: the updater's token weighting; keep it equal to
            ``UpdateOptions.lightningrl.loss_aggregation`` (the default of both is the same).
        engine: keyword arguments of each slot's :class:`~agentbolt_torch.generation.engine.GenerationEngine`
            (``max_batch_size``, ``default_max_tokens``, ``prompt_cache_mb``, ...).
        device: ``"cpu"`` or ``"cuda"``.
        seed: the model's (``"tiny"``) and LoRA adapters' initialisation, and the slots' sampler.
        autocast_dtype: :class:`~agentbolt_torch.policy.Policy`'s (``"auto"``: bf16 where fast).
        served_model_name: the model name clients see (default: the model's name).
        swap_timeout_s: how long :meth:`stage` waits for calls still running on the standby slot
            before it copies new weights in (they always finish on the weights they started with).
    """

    trains = True

    def __init__(
        self,
        model: str | os.PathLike[str] = "smollm2",
        *,
        lora: LoraSettings | None = None,
        update: UpdateConfig | None = None,
        loss_aggregation: LossAggregation = DEFAULT_LOSS_AGGREGATION,
        engine: Mapping[str, Any] | None = None,
        device: str = "cpu",
        seed: int = 0,
        autocast_dtype: torch.dtype | str | None = "auto",
        served_model_name: str | None = None,
        swap_timeout_s: float = 600.0,
    ) -> None:
        spec = os.fspath(model)
        if spec not in ("smollm2", "tiny") and not Path(spec).is_dir():
            raise UserError(f"model {spec!r} is neither 'smollm2', 'tiny' nor a local Hugging Face directory")
        self.spec = spec
        self.model = served_model_name or (spec if spec in ("smollm2", "tiny") else Path(spec).name)
        """The model name live requests are forced to (and the slots serve)."""
        self.lora = lora
        self.update_config = update
        self.loss_aggregation = loss_aggregation
        self.engine_options = dict(engine or {})
        self.device = device
        self.seed = seed
        self.autocast_dtype = autocast_dtype
        self.swap_timeout_s = swap_timeout_s
        self._policy: Policy | None = None
        self._updater: PolicyUpdater | None = None
        self._slots: list[PolicyServer] = []
        self._live = 0
        self._state: _State = "clean"
        self._snapshot: dict[str, Any] | None = None
        self._lock = threading.RLock()

    # -- what a user may look at --------------------------------------------------------------------

    @property
    def policy(self) -> Policy:
        """The training copy."""
        return self._started()[0]

    @property
    def updater(self) -> PolicyUpdater:
        """The updater training :attr:`policy`."""
        return self._started()[1]

    @property
    def live(self) -> PolicyServer:
        """The slot live calls go to."""
        self._started()
        return self._slots[self._live]

    @property
    def standby(self) -> PolicyServer:
        """The other slot: the candidate's, or the former live one."""
        self._started()
        return self._slots[1 - self._live]

    @property
    def live_version(self) -> int:
        """The policy version the live slot serves."""
        return self.live.engine.served_version

    def _started(self) -> tuple[Policy, PolicyUpdater]:
        if self._policy is None or self._updater is None:
            raise UserError("the policy is not started: call start(version, checkpoint) first (agentbolt serve does)")
        return self._policy, self._updater

    # -- OnlinePolicy -------------------------------------------------------------------------------

    def start(self, version: int, checkpoint: Path | None) -> Upstream:
        """Load the model (and ``checkpoint``: weights or adapter, optimizer, from :meth:`save`),
        give it policy version ``version``, and serve it from both slots; returns the live one."""
        import torch

        from ..generation.engine import GenerationEngine
        from ..policy import Policy
        from ..serving.server import PolicyServer
        from ..update.updater import PolicyUpdater

        with self._lock:
            if self._policy is not None:
                raise UserError("the policy is already started; stop() it first")
            with torch.random.fork_rng(devices=[]):  # LoRA's initialisation, without touching the caller's RNG
                torch.manual_seed(self.seed)
                policy = Policy.load(
                    self.spec,
                    name=self.model,
                    lora=self.lora,
                    autocast_dtype=self.autocast_dtype,
                    device=self.device,
                    seed=self.seed,
                )
            updater = PolicyUpdater(policy, self.update_config, loss_aggregation=self.loss_aggregation)
            if checkpoint is not None:
                updater.load_checkpoint(checkpoint)
                if policy.version != version:
                    log.warning(
                        "checkpoint %s holds version %d; serving it as version %d", checkpoint, policy.version, version
                    )
            policy.set_version(version)
            slots: list[PolicyServer] = []
            try:
                for i in range(2):
                    engine = GenerationEngine(policy, **{"seed": self.seed + i, **self.engine_options})
                    engine.serve_copy()
                    slots.append(PolicyServer(engine, served_model_name=self.model).start())
            except BaseException:
                for slot in slots:
                    slot.stop()
                raise
            self._policy, self._updater, self._slots = policy, updater, slots
            self._live, self._state, self._snapshot = 0, "clean", None
            log.info(
                "serving %s version %d on %s (standby %s)", self.model, version, slots[0].base_url, slots[1].base_url
            )
            return self._upstream(self._live)

    def train(self, rows: Sequence[Any]) -> Mapping[str, float]:
        """Update the training copy from LightningRL's training rows; returns the updater's
        metrics (``loss``, ``kl``, ``clip_frac``, ``grad_norm``, ... as floats). The slots keep
        serving meanwhile (they read their own copies)."""
        _, updater = self._started()
        with self._lock:
            if self._state == "staged":
                raise UserError("a candidate is staged: promote() or revert() it before training again")
            if self._state == "clean":
                self._snapshot = _optimizer_snapshot(updater)
            self._state = "trained"
            metrics = updater.update(rows)
        return metrics.as_dict()

    def stage(self, version: int) -> Upstream:
        """Copy the training copy into the standby slot as policy ``version``; returns the standby
        slot. Calls still running there finish on the old weights first (``swap_timeout_s``)."""
        policy, _ = self._started()
        with self._lock:
            policy.set_version(version)
            self.standby.engine.swap_weights(drain=True, timeout=self.swap_timeout_s)
            self._state = "staged"
            return self._upstream(1 - self._live)

    def promote(self) -> Upstream:
        """The standby slot (the staged candidate) becomes live; returns the former live slot,
        which the caller drains (:meth:`release`) before it is staged again."""
        self._started()
        with self._lock:
            if self._state != "staged":
                raise UserError("nothing is staged: stage(version) a candidate before promote()")
            former = self._live
            self._live = 1 - self._live
            self._state, self._snapshot = "clean", None
            return self._upstream(former)

    def release(self, timeout_s: float) -> None:
        """Wait (at most ``timeout_s``) until the standby slot (the former live one) has no call
        running or queued. After a timeout the calls left still finish on their weights: the next
        :meth:`stage` waits for them before copying."""
        self._started()
        engine = self.standby.engine
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                engine.pause(drain=True, timeout=max(deadline - time.monotonic(), 0.0))
            except TimeoutError:
                engine.resume()
                break
            queued = engine.num_queued  # admission is paused: nothing can start while we look
            engine.resume()
            if queued == 0:
                return
            if time.monotonic() >= deadline:
                break
            time.sleep(0.01)
        log.warning(
            "the former live slot still has %d calls after %g s; the next stage waits for them",
            engine.num_active + engine.num_queued,
            timeout_s,
        )

    def revert(self) -> None:
        """A candidate was rejected: the training copy goes back to the live slot's weights and
        version, bit for bit.

        **The optimizer goes back too**: AdamW's moments (and the scheduler's step and the
        updater's step count) return to the snapshot taken before the first update since the
        live weights, as if the rejected update had never run. Keeping them would carry the
        rejected update's gradients into the next update through the first moment (0.9 of it
        the next step) and its outliers through the second; resetting them would also forget
        the accepted updates' statistics. The snapshot costs a copy of the moments while a
        candidate waits for the gate (none with nothing trained yet).
        """
        policy, updater = self._started()
        import torch

        with self._lock:
            served = self.live.engine.serving_copy
            assert served is not None
            live = dict(served.model.named_parameters())
            with policy.lock, served.lock, torch.no_grad():
                for name, param in policy.model.named_parameters():
                    if param.requires_grad:
                        param.copy_(live[name])
                policy.set_version(served.version)
                policy.mark_weights_changed()
            if self._snapshot is not None:
                _restore_optimizer(updater, self._snapshot)
            self._state, self._snapshot = "clean", None

    def save(self, directory: Path) -> None:
        """Save the version going live (the staged candidate: ``agentbolt serve`` saves it just
        before :meth:`promote`), or the live weights when nothing is staged: the updater's
        checkpoint (``model/`` or, with LoRA, ``adapter/``; ``optimizer.pt``; ``state.json``),
        which :meth:`start` loads after a restart."""
        _, updater = self._started()
        with self._lock:
            if self._state == "trained":
                raise UserError(
                    "the training copy was updated since the last stage(): stage() it or revert() it before save()"
                )
            updater.save_checkpoint(directory)

    def stop(self) -> None:
        """Stop both slots and free the model (idempotent)."""
        with self._lock:
            for slot in self._slots:
                slot.stop()
                slot.engine.stop()
            self._slots = []
            self._policy = self._updater = None
            self._state, self._snapshot = "clean", None

    # -- helpers ------------------------------------------------------------------------------------

    def _upstream(self, slot: int) -> Upstream:
        return Upstream(self._slots[slot].base_url, model=self.model)

    def __repr__(self) -> str:
        started = f", live={self.live_version}" if self._policy is not None else ""
        return f"TorchOnlinePolicy({self.spec!r}, lora={self.lora is not None}{started})"


def _optimizer_snapshot(updater: PolicyUpdater) -> dict[str, Any]:
    """The optimizer's and scheduler's state and the step count, copied (tensors on the CPU)."""
    return {
        "optimizer": _to_cpu(copy.deepcopy(updater.optimizer.state_dict())),
        "scheduler": copy.deepcopy(updater.scheduler.state_dict()),
        "step": updater.step,
    }


def _restore_optimizer(updater: PolicyUpdater, snapshot: Mapping[str, Any]) -> None:
    with updater.policy.lock:
        updater.optimizer.load_state_dict(snapshot["optimizer"])  # moves tensors to the parameters' device
        updater.scheduler.load_state_dict(snapshot["scheduler"])
        updater.step = int(snapshot["step"])


def _to_cpu(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_cpu(v) for v in value]
    return value


# -- ready-made policies for ``agentbolt serve --policy agentbolt_torch.training.online:NAME`` ----------------


def smollm2() -> TorchOnlinePolicy:
    """SmolLM2-135M-Instruct, full fine-tuning (``--policy agentbolt_torch.training.online:smollm2``)."""
    return TorchOnlinePolicy("smollm2")


def smollm2_lora() -> TorchOnlinePolicy:
    """SmolLM2-135M-Instruct with LoRA adapters (r=16, lr 1e-4; ``--policy agentbolt_torch.training.online:smollm2_lora``)."""
    from ..policy import LoraSettings
    from ..update.updater import UpdateConfig

    return TorchOnlinePolicy("smollm2", lora=LoraSettings(), update=UpdateConfig(lr=1e-4))


def tiny() -> TorchOnlinePolicy:
    """The random ~100k-parameter test model (to try the command line in seconds; it learns nothing useful)."""
    return TorchOnlinePolicy("tiny")


if TYPE_CHECKING:
    from agentbolt.online import OnlinePolicy

    def _implements_the_protocol(policy: TorchOnlinePolicy) -> OnlinePolicy:  # checked by mypy
        return policy
