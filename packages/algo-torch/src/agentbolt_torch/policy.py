"""The policy being trained, shared in-process by the policy server and the updater.

A :class:`Policy` bundles the ``nn.Module`` (optionally wrapped with LoRA adapters), its
tokenizer, the **policy version** and the **lock** that serializes generation and updates:

- the generation engine holds :attr:`Policy.lock` around every forward pass (one decode step
  or one prefill), so an update can never run in the middle of one;
- the updater holds it for the whole update, switches the model to train mode and back to
  eval mode, and bumps :attr:`Policy.version` after the optimizer step.

Weights are never copied between the two: the server samples from exactly the parameters the
optimizer updates. Both sides use the same autocast setting (:meth:`Policy.autocast`), so the
logprobs the server reports and the ones the update recomputes come from the same numerics.

Autocast (``autocast_dtype="auto"``, the default) is bf16 with fp32 master weights where the
hardware has fast bf16 matrix units (CPUs with AMX or AVX512-BF16, CUDA GPUs with bf16) and
off (plain fp32) elsewhere: on a CPU without them bf16 matmuls are emulated and about 4x
slower than fp32 (measured: 45 vs 170-240 GFLOP/s on an AVX512 Xeon without BF16).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from agentbolt.errors import MissingDependencyError, UserError

from .adapters import LoraSettings
from .attention import use_grouped_attention

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

__all__ = ["LoraSettings", "Policy", "default_autocast_dtype"]

logger = logging.getLogger(__name__)

_P = ParamSpec("_P")
_T = TypeVar("_T")


class Policy:
    """A causal LM being trained, with its tokenizer, version and generation/update lock.

    Args:
        model: a Hugging Face causal LM (or a ``peft`` model wrapping one).
        tokenizer: its tokenizer; must have a chat template for ``/v1/chat/completions``.
        name: the model name served by the policy server.
        version: the initial policy version.
        autocast_dtype: dtype for ``torch.autocast`` in generation and updates: ``"auto"``
            (bf16 where the hardware runs it fast, see :func:`default_autocast_dtype`), a dtype
            or its name (``"bfloat16"``), or ``None`` to run in the weights' dtype.
        lora: wrap ``model`` with fresh LoRA adapters (the base weights are then frozen).
        adapters: instead of ``lora``, one named LoRA adapter per policy on the shared base
            (policies by role, :mod:`agentbolt_torch.adapters`): each has its own version
            (:meth:`version_of`); generation picks one per request.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: PreTrainedTokenizerBase,
        *,
        name: str = "policy",
        version: int = 0,
        autocast_dtype: torch.dtype | str | None = "auto",
        lora: LoraSettings | None = None,
        adapters: Mapping[str, LoraSettings] | None = None,
    ) -> None:
        import torch

        if lora is not None and adapters:
            raise UserError("Policy takes lora= (one adapter) or adapters= (one per policy), not both")
        if lora is not None:
            model = apply_lora(model, lora)
        if adapters:
            from .adapters import apply_adapters

            model = apply_adapters(model, adapters)
        if autocast_dtype == "auto":
            autocast_dtype = default_autocast_dtype(next(model.parameters()).device)
        use_grouped_attention(model)
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        self.lora = lora
        self.autocast_dtype: torch.dtype | None = (
            getattr(torch, autocast_dtype) if isinstance(autocast_dtype, str) else autocast_dtype
        )
        self.lock = threading.RLock()
        """Held by each generation forward pass and by each whole update."""
        self._version = int(version)
        self.adapters: tuple[str, ...] = tuple(adapters or ())
        """The named adapters (policies by role); empty for one policy."""
        self._adapter_versions = dict.fromkeys(self.adapters, int(version))
        self._weights_generation = 0
        self._training_thread: concurrent.futures.ThreadPoolExecutor | None = None
        self._training_thread_lock = threading.Lock()
        self._training_ident: int | None = None
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        model.eval()

    @classmethod
    def load(
        cls,
        spec: str | os.PathLike[str],
        *,
        name: str | None = None,
        lora: LoraSettings | None = None,
        adapters: Mapping[str, LoraSettings] | None = None,
        autocast_dtype: torch.dtype | str | None = "auto",
        device: str = "cpu",
        seed: int = 0,
    ) -> Policy:
        """Load ``spec`` (``"smollm2"``, ``"tiny"`` or a local directory; see :func:`~agentbolt_torch.models.load_model`)."""
        from .models import load_model

        model, tokenizer = load_model(spec, device=device, seed=seed)
        served = name or (str(spec) if str(spec) in ("smollm2", "tiny") else os.path.basename(os.fspath(spec)))
        return cls(model, tokenizer, name=served, lora=lora, adapters=adapters, autocast_dtype=autocast_dtype)

    # -- version -----------------------------------------------------------------------------

    @property
    def version(self) -> int:
        """The policy version: bumped by every update (of any adapter); reported with every
        generated response of a single policy."""
        return self._version

    def set_version(self, version: int, adapter: str | None = None) -> None:
        """Set the version (e.g. to the store's resources version after publishing), or, with
        ``adapter``, that adapter's version."""
        with self.lock:
            if adapter is None:
                self._version = int(version)
            else:
                self._adapter_versions[self._adapter(adapter)] = int(version)

    def bump_version(self, adapter: str | None = None) -> int:
        """Increase the version by one and return it; with ``adapter``, also that adapter's
        version (returned instead)."""
        with self.lock:
            self._version += 1
            if adapter is None:
                return self._version
            name = self._adapter(adapter)
            self._adapter_versions[name] += 1
            return self._adapter_versions[name]

    def version_of(self, adapter: str | None) -> int:
        """The version of what serves a request for ``adapter``: the adapter's own (bumped only by
        its updates), 0 for the base model (:data:`~agentbolt_torch.adapters.BASE`: never
        trained), :attr:`version` for ``None`` (a single policy)."""
        if adapter is None:
            return self._version
        if adapter == "__base__":
            return 0
        return self._adapter_versions[self._adapter(adapter)]

    def _adapter(self, name: str) -> str:
        if name not in self._adapter_versions:
            raise UserError(f"no adapter {name!r}; the policy has {list(self.adapters) or 'none'}")
        return name

    @property
    def weights_generation(self) -> int:
        """Counter bumped by :meth:`mark_weights_changed` (generation caches depend on it)."""
        return self._weights_generation

    def mark_weights_changed(self) -> None:
        """Tell generation that parameters changed in place (the updater and checkpoint loading
        call it; call it yourself after editing weights by hand)."""
        with self.lock:
            self._weights_generation += 1

    # -- the training thread ---------------------------------------------------------------------

    def on_training_thread(self, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """Run ``fn`` on this policy's one training thread (started on first use) and return its
        result (or raise its exception); a call from that thread runs directly.

        The updaters of a policy run their updates here, whatever thread calls them: allocators
        keep a thread's freed memory for that thread (glibc's per-thread arenas), so work that
        allocates an update's activations on varying threads (``asyncio.to_thread``) would keep
        one update's worth of memory per thread.
        """
        with self._training_thread_lock:
            if self._training_thread is None:
                self._training_thread = concurrent.futures.ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix="agentbolt-training", initializer=self._enter_training_thread
                )
            executor = self._training_thread
        if threading.get_ident() == self._training_ident:
            return fn(*args, **kwargs)
        return executor.submit(fn, *args, **kwargs).result()

    def _enter_training_thread(self) -> None:
        self._training_ident = threading.get_ident()

    # -- helpers -------------------------------------------------------------------------------

    @property
    def device(self) -> torch.device:
        """Device of the model's parameters."""
        return next(self.model.parameters()).device

    @property
    def is_lora(self) -> bool:
        """True when the model carries ``peft`` LoRA adapters."""
        return _is_peft(self.model)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The autocast context both generation and updates run under."""
        import torch

        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    @contextlib.contextmanager
    def reference(self) -> Iterator[Any]:
        """With LoRA: the same module with its adapters disabled (the frozen base model)."""
        if not self.is_lora:
            raise UserError("Policy.reference() is only available for LoRA policies")
        with self.model.disable_adapter():
            yield self.model

    @property
    def eos_token_ids(self) -> list[int]:
        """Token ids that end a generation: the tokenizer's eos and the generation config's."""
        ids: list[int] = []
        for value in (
            self.tokenizer.eos_token_id,
            getattr(getattr(self.base_model, "generation_config", None), "eos_token_id", None),
        ):
            if value is None:
                continue
            for v in value if isinstance(value, list | tuple) else [value]:
                if int(v) not in ids:
                    ids.append(int(v))
        return ids

    @property
    def base_model(self) -> Any:
        """The underlying transformers model (inside the ``peft`` wrapper, if any)."""
        return self.model.get_base_model() if _is_peft(self.model) else self.model

    @property
    def max_model_len(self) -> int:
        """Context length: the config's ``max_position_embeddings`` (or 4096)."""
        return int(getattr(self.base_model.config, "max_position_embeddings", None) or 4096)

    def __repr__(self) -> str:
        adapters = f", adapters={list(self.adapters)}" if self.adapters else ""
        return f"Policy(name={self.name!r}, version={self.version}, lora={self.is_lora}{adapters})"


def default_autocast_dtype(device: Any = "cpu") -> torch.dtype | None:
    """``torch.bfloat16`` where bf16 matmuls are fast on ``device``, else ``None`` (fp32).

    CUDA: bf16 when the GPU supports it. CPU: bf16 only with AMX tiles or AVX512-BF16; without
    them PyTorch emulates bf16 and autocast makes training and generation several times slower.
    """
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else None
    if device.type == "cpu":
        try:
            fast = torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported()
        except AttributeError:  # older/newer torch without these probes: stay exact
            fast = False
        return torch.bfloat16 if fast else None
    return None


def _is_peft(model: Any) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "get_base_model")


def apply_lora(model: Any, settings: LoraSettings) -> Any:
    """Wrap ``model`` with fresh LoRA adapters; only the adapters are trainable."""
    try:
        from peft import get_peft_model
    except ImportError as exc:
        raise MissingDependencyError("peft", "'agentbolt-torch[lora]'", "LoRA training") from exc
    from .adapters import lora_config

    return get_peft_model(model, lora_config(settings))
