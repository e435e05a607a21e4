"""Writing a policy's weights where a vLLM server reads them.

- :func:`export_base` writes the model vLLM serves at start-up: the full weights of a full
  fine-tune, or the frozen base of a LoRA policy (adapter layers folded away, peft's
  ``base_layer`` names mapped back), with its config and the policy's tokenizer and chat template
  (so vLLM renders and tokenizes prompts as the policy does);
- :func:`write_full_weights` rewrites ``model.safetensors`` in that folder with the current
  weights, what ``reload_weights`` then reads in place;
- :func:`write_adapter` writes one LoRA adapter (``adapter_config.json`` +
  ``adapter_model.safetensors``, peft's format) to its own folder, what
  ``/v1/load_lora_adapter`` loads under the adapter's name.

Each weights file goes to a temporary file renamed into place, so vLLM never reads half a file
(vLLM reads an adapter folder only when it is asked to load it, after the write).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from ..policy import Policy

__all__ = ["base_state_dict", "export_base", "write_adapter", "write_full_weights"]

_BASE_LAYER = re.compile(r"\.base_layer(?=\.)")


def base_state_dict(policy: Policy) -> dict[str, torch.Tensor]:
    """The base model's weights under the transformers names vLLM loads (a LoRA policy's base:
    adapter weights left out, ``.base_layer`` dropped from the names), contiguous and detached.

    Tied weights (SmolLM2's embeddings and ``lm_head``) are written under both names, the second
    as a copy: vLLM ties them at load, but an in-place ``reload_weights`` leaves ``lm_head`` with
    the old values unless ``lm_head.weight`` is in the file (measured: the served logprobs then
    match the new embeddings with the old head)."""
    model = policy.base_model
    state: dict[str, Any] = {}
    seen: set[int] = set()
    for name, tensor in model.state_dict().items():
        if "lora_" in name:
            continue
        key = _BASE_LAYER.sub("", name)
        value = tensor.detach().contiguous()
        if value.data_ptr() in seen:
            value = value.clone()  # safetensors stores no shared memory
        seen.add(value.data_ptr())
        state[key] = value
    if getattr(model.config, "tie_word_embeddings", False) and "lm_head.weight" not in state:
        embeddings = model.get_input_embeddings().weight
        state["lm_head.weight"] = embeddings.detach().clone()
    return state


def _save_atomic(tensors: dict[str, Any], path: Path) -> None:
    from safetensors.torch import save_file

    tmp = path.with_name(f".{path.name}.tmp")
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, path)


def write_full_weights(policy: Policy, model_dir: str | os.PathLike[str]) -> Path:
    """Write the policy's current base weights to ``model_dir/model.safetensors`` (under
    :attr:`Policy.lock <agentbolt_torch.policy.Policy.lock>`, so an update in progress is not
    half-written); returns the file."""
    path = Path(model_dir) / "model.safetensors"
    with policy.lock:
        _save_atomic(base_state_dict(policy), path)
    return path


def export_base(policy: Policy, model_dir: str | os.PathLike[str]) -> Path:
    """Write the folder vLLM serves: weights (:func:`write_full_weights`), config, generation
    config, tokenizer and its chat template."""
    out = Path(model_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = policy.base_model
    model.config.save_pretrained(out)
    generation = getattr(model, "generation_config", None)
    if generation is not None:
        generation.save_pretrained(out)
    policy.tokenizer.save_pretrained(out)
    write_full_weights(policy, out)
    return out


def write_adapter(policy: Policy, adapter: str, out_dir: str | os.PathLike[str], *, zero: bool = False) -> Path:
    """Write LoRA adapter ``adapter`` of ``policy`` (peft's ``adapter_config.json`` and
    ``adapter_model.safetensors``) to ``out_dir``; returns the folder. ``zero=True`` writes its
    shape with zero weights: an adapter that leaves the base model unchanged."""
    from ..adapters import adapter_state

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with policy.lock:
        weights = {k: v.detach().contiguous().clone() for k, v in adapter_state(policy.model, adapter).items()}
    if zero:
        weights = {k: v.zero_() for k, v in weights.items()}
    policy.model.peft_config[adapter].save_pretrained(str(out))  # peft's own adapter_config.json
    _save_atomic(weights, out / "adapter_model.safetensors")
    return out
