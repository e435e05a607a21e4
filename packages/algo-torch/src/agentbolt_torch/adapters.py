"""Several named LoRA adapters on one base model: one trained policy per agent role.

:class:`~agentbolt_torch.policy.Policy` ``(adapters={"writer": LoraSettings(r=16), ...})`` wraps its
model with :func:`apply_adapters`: a ``peft`` model holding one adapter per policy, the base
weights frozen and shared, so memory is the base plus N adapters. What reads them:

- **generation** (:class:`~agentbolt_torch.generation.engine.GenerationEngine`) runs rows of different
  adapters in one forward pass with peft's mixed-adapter batches (``adapter_names=[...]``, one
  name per row; :data:`BASE` runs a row on the base model alone), so routing costs no extra pass;
- **training** (:class:`~agentbolt_torch.update.updater.PolicyUpdater` ``(adapter=name)``) activates one
  adapter (:func:`activate`), optimizes only :func:`adapter_parameters` of it, and bumps only its
  version (:meth:`Policy.bump_version(name) <agentbolt_torch.policy.Policy.bump_version>`);
- **checkpoints** save and load one adapter by name (:func:`adapter_state`,
  :func:`load_adapter_weights`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentbolt.errors import MissingDependencyError, UserError

if TYPE_CHECKING:
    import torch

__all__ = [
    "BASE",
    "LoraSettings",
    "activate",
    "adapter_file",
    "adapter_parameters",
    "adapter_state",
    "apply_adapters",
    "check_names",
    "load_adapter_weights",
    "lora_config",
]

BASE = "__base__"
"""peft's name for "no adapter" in a mixed batch: the row runs on the base model alone."""


@dataclass(frozen=True)
class LoraSettings:
    """LoRA adapter settings (needs ``peft``: ``pip install 'agentbolt-torch[lora]'``)."""

    r: int = 16
    """Adapter rank."""
    alpha: int = 32
    """Scaling numerator (the adapter output is scaled by ``alpha / r``)."""
    dropout: float = 0.0
    """Dropout on the adapter input during training."""
    target_modules: Sequence[str] = ("q_proj", "k_proj", "v_proj", "o_proj")
    """Names of the linear layers to adapt."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Any other ``peft.LoraConfig`` argument."""


def lora_config(settings: LoraSettings) -> Any:
    """The ``peft.LoraConfig`` of ``settings``."""
    try:
        from peft import LoraConfig
    except ImportError as exc:
        raise MissingDependencyError("peft", "'agentbolt-torch[lora]'", "LoRA adapters per role") from exc
    return LoraConfig(
        r=settings.r,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=list(settings.target_modules),
        task_type="CAUSAL_LM",
        bias="none",
        **settings.extra,
    )


def apply_adapters(model: Any, adapters: Mapping[str, LoraSettings]) -> Any:
    """Wrap ``model`` with one fresh LoRA adapter per name (the base weights frozen)."""
    from peft import get_peft_model

    if not adapters:
        raise UserError("apply_adapters needs at least one adapter")
    bad = [name for name in adapters if name == BASE or "." in name or not name]
    if bad:
        raise UserError(f"adapter names may not be empty, contain '.', or be {BASE!r}: {bad}")
    items = list(adapters.items())
    first, settings = items[0]
    peft_model = get_peft_model(model, lora_config(settings), adapter_name=first)
    for name, settings in items[1:]:
        peft_model.add_adapter(name, lora_config(settings))
    return peft_model


def adapter_parameters(model: Any, name: str) -> list[torch.nn.Parameter]:
    """The parameters of adapter ``name`` (and of no other adapter, nor of the base)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    params: list[Any] = []
    for module in model.modules():
        if not isinstance(module, BaseTunerLayer):
            continue
        for attr in module.adapter_layer_names:
            layers = getattr(module, attr)
            if name in layers:
                layer = layers[name]
                params.extend(layer.parameters() if hasattr(layer, "parameters") else [layer])
    if not params:
        raise UserError(f"the model has no adapter {name!r}")
    return params


def activate(model: Any, name: str) -> None:
    """Make ``name`` the adapter that forward passes without ``adapter_names`` use (and train)."""
    if getattr(model, "active_adapter", None) != name:
        model.set_adapter(name)


def adapter_state(model: Any, name: str) -> dict[str, torch.Tensor]:
    """Adapter ``name``'s weights with peft's saved key names (what ``adapter_model.safetensors`` holds)."""
    from peft import get_peft_model_state_dict

    return get_peft_model_state_dict(model, adapter_name=name)


def adapter_file(source: str | Path) -> Path:
    """The ``adapter_model.safetensors`` of an adapter, from any of: an adapter folder, a
    single-policy LoRA checkpoint (``checkpoint-N``, holding ``adapter/``), or one policy of a
    per-role checkpoint (``checkpoint-N/policies/<name>``)."""
    root = Path(source)
    candidates = [root, root / "adapter"]
    candidates += [p for c in list(candidates) if c.is_dir() for p in sorted(c.iterdir()) if p.is_dir()]
    for folder in candidates:
        file = folder / "adapter_model.safetensors"
        if file.is_file():
            return file
    raise UserError(
        f"init_from={source!s}: no LoRA adapter there (expected adapter_model.safetensors in the folder, in its "
        "adapter/ or in a checkpoint of one policy: checkpoint-N/policies/<name>)"
    )


def load_adapter_weights(model: Any, name: str, weights: Mapping[str, Any], *, source: str = "") -> None:
    """Load saved weights (peft key names) into adapter ``name``; refuses weights that do not fit."""
    from peft import set_peft_model_state_dict

    expected = set(adapter_state(model, name))
    given = set(weights)
    if given != expected:
        missing, unexpected = sorted(expected - given), sorted(given - expected)
        raise UserError(
            f"adapter weights {source} do not fit adapter {name!r} (rank and target modules must match): "
            f"missing {missing[:3]}, unexpected {unexpected[:3]}"
        )
    current = adapter_state(model, name)
    for key, value in weights.items():
        if tuple(value.shape) != tuple(current[key].shape):
            raise UserError(
                f"adapter weights {source} do not fit adapter {name!r}: {key} has shape {tuple(value.shape)}, "
                f"the adapter {tuple(current[key].shape)} (use the same rank)"
            )
    set_peft_model_state_dict(model, dict(weights), adapter_name=name)


def check_names(names: Sequence[str], available: Sequence[str]) -> None:
    """Raise when one of ``names`` is not an adapter of the model."""
    unknown = [n for n in names if n not in available and n != BASE]
    if unknown:
        raise UserError(f"unknown adapter(s) {unknown}; the policy has {list(available)}")
