"""Checkpoints of the policy update: the model (or only the LoRA adapter), optimizer and scheduler,
update step, policy version and every RNG state, written atomically and restored with checks.

:meth:`PolicyUpdater.save_checkpoint <agentbolt_torch.update.updater.PolicyUpdater.save_checkpoint>` and
:meth:`~agentbolt_torch.update.updater.PolicyUpdater.load_checkpoint` are the entry points; the functions
here take the pieces of state as a :class:`CheckpointTarget`.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentbolt.errors import UserError

if TYPE_CHECKING:
    from ..policy import Policy
    from .config import UpdateConfig

__all__ = ["CHECKPOINT_FORMAT", "CheckpointTarget", "load_checkpoint", "save_checkpoint"]

CHECKPOINT_FORMAT = 1
"""Version of the checkpoint layout, written to ``state.json``."""


@dataclass(frozen=True)
class CheckpointTarget:
    """The state a checkpoint holds and restores (one updater's)."""

    policy: Policy
    optimizer: Any
    scheduler: Any
    rng: random.Random
    """The updater's own RNG (mini-batch shuffling)."""
    adapter: str | None = None
    """With a policy of several adapters: the one whose weights and version are saved."""


def save_checkpoint(
    path: str | os.PathLike[str], target: CheckpointTarget, *, step: int, config: UpdateConfig, loss_aggregation: str
) -> Path:
    """Write a checkpoint directory atomically (replacing one at ``path``).

    Contents: ``model/`` (full weights, a loadable Hugging Face directory with the
    tokenizer) or ``adapter/`` (LoRA adapter only; with ``target.adapter``, that one of the policy's
    adapters, as a peft adapter folder), ``optimizer.pt`` (optimizer and scheduler), ``rng.pt``
    (torch, Python, numpy and the updater's ``rng``) and ``state.json`` (``step``, policy version,
    ``adapter``, ``config``, ``loss_aggregation``). Written under ``policy.lock``.
    """
    import numpy as np
    import torch

    policy, adapter = target.policy, target.adapter
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        with policy.lock:
            if adapter is not None:
                from safetensors.torch import save_file

                from ..adapters import adapter_state

                (tmp / "adapter").mkdir()
                save_file(
                    {k: v.detach().contiguous() for k, v in adapter_state(policy.model, adapter).items()},
                    str(tmp / "adapter" / "adapter_model.safetensors"),
                )
                policy.model.peft_config[adapter].save_pretrained(str(tmp / "adapter"))
            elif policy.is_lora:
                policy.model.save_pretrained(tmp / "adapter")
            else:
                policy.model.save_pretrained(tmp / "model")
                policy.tokenizer.save_pretrained(tmp / "model")
            torch.save(
                {"optimizer": target.optimizer.state_dict(), "scheduler": target.scheduler.state_dict()},
                tmp / "optimizer.pt",
            )
            torch.save(
                {
                    "torch": torch.get_rng_state(),
                    "python": random.getstate(),
                    "numpy": np.random.get_state(),
                    "updater": target.rng.getstate(),
                },
                tmp / "rng.pt",
            )
            state = {
                "format": CHECKPOINT_FORMAT,
                "step": step,
                "policy_version": policy.version_of(adapter),
                "lora": policy.is_lora,
                "adapter": adapter,
                "config": asdict(config),
                "loss_aggregation": loss_aggregation,
                "saved_at": time.time(),
            }
        (tmp / "state.json").write_text(json.dumps(state, indent=2, default=str))
        install_directory(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return path


def install_directory(tmp: Path, path: Path) -> None:
    """Put the finished directory ``tmp`` at ``path`` (replacing what is there, by renames: a reader
    sees the old directory or the new one, never half of one)."""
    tmp.chmod(0o755)
    if path.exists():
        old = path.with_name(f".{path.name}.old-{os.getpid()}")
        path.rename(old)
        tmp.rename(path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(path)


def load_checkpoint(path: str | os.PathLike[str], target: CheckpointTarget) -> dict[str, Any]:
    """Restore weights (or adapter; with ``target.adapter``, into that one of the policy's adapters),
    optimizer, scheduler, policy version and RNG states; return ``state.json``.

    Runs under ``policy.lock``; the caller restores its own ``state["step"]``.

    Raises:
        UserError: ``path`` is not a checkpoint, or its weights do not fit the policy.
    """
    import numpy as np
    import torch
    from safetensors.torch import load_file

    policy, adapter = target.policy, target.adapter
    path = Path(path)
    state_file = path / "state.json"
    if not state_file.is_file():
        raise UserError(f"{path} is not an agentbolt-torch checkpoint (no state.json)")
    state = json.loads(state_file.read_text())
    if bool(state.get("lora")) != policy.is_lora:
        kind = "a LoRA" if state.get("lora") else "a full-model"
        raise UserError(f"{path} is {kind} checkpoint; build the Policy with matching lora settings")
    with policy.lock:
        if adapter is not None:
            from ..adapters import load_adapter_weights

            weights = load_file(str(path / "adapter" / "adapter_model.safetensors"))
            load_adapter_weights(policy.model, adapter, weights, source=f"in {path}")
        elif policy.is_lora:
            from peft import set_peft_model_state_dict

            weights = load_file(str(path / "adapter" / "adapter_model.safetensors"))
            result = set_peft_model_state_dict(policy.model, weights)
            unexpected = getattr(result, "unexpected_keys", [])
            if unexpected:
                raise UserError(f"adapter in {path} does not match the policy: unexpected {unexpected[:3]}")
        else:
            weights = {}
            for file in sorted((path / "model").glob("*.safetensors")):
                weights.update(load_file(str(file)))
            model = policy.base_model
            missing, unexpected = model.load_state_dict(weights, strict=False)
            tied = (
                {k for k in missing if "lm_head" in k} if getattr(model.config, "tie_word_embeddings", False) else set()
            )
            if unexpected or set(missing) - tied:
                raise UserError(
                    f"weights in {path} do not match the policy: missing {sorted(set(missing) - tied)[:3]}, "
                    f"unexpected {sorted(unexpected)[:3]}"
                )
        opt = torch.load(path / "optimizer.pt", map_location=policy.device, weights_only=False)
        target.optimizer.load_state_dict(opt["optimizer"])
        target.scheduler.load_state_dict(opt["scheduler"])
        rng_states = torch.load(path / "rng.pt", weights_only=False)
        torch.set_rng_state(rng_states["torch"])
        random.setstate(rng_states["python"])
        np.random.set_state(rng_states["numpy"])
        target.rng.setstate(rng_states["updater"])
        policy.mark_weights_changed()
        policy.set_version(int(state["policy_version"]), adapter)
    return state
