"""The option groups of :class:`~agentbolt_torch.training.algorithm.TorchGRPO` (and ``torch-sft``).

Like :class:`~agentbolt.trainer.Trainer`'s (:mod:`agentbolt.options`), each group is a frozen
pydantic model; a mapping of its fields works wherever the group does, and a wrong field name or
value is a :class:`~agentbolt.errors.UserError` naming the valid fields::

    TorchGRPO(
        "smollm2",
        steps=30,
        sampling=SamplingOptions(max_tokens=40),
        evaluation={"every": 5, "samples": 2},
        policy=PolicyOptions(lora=LoraSettings(r=16)),
        output={"out_dir": "runs/mine", "checkpoint_every": 10},
    )
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import Field, model_validator

from agentbolt.options import OptionGroup

__all__ = ["EvaluationOptions", "GenerationOptions", "OutputOptions", "PolicyOptions", "SamplingOptions"]


class _Group(OptionGroup):
    @classmethod
    def from_value(cls, value: Self | Mapping[str, Any] | None, /, *, option: str) -> Self:
        """The options from an instance, a mapping of its fields or ``None`` (the defaults)."""
        return cls() if value is None else cls.coerce(value, option=option)


class SamplingOptions(_Group):
    """The sampling the gateway forces on every training call."""

    temperature: float = Field(default=1.0, ge=0)
    """0: greedy."""
    max_tokens: int = Field(default=64, ge=1)
    """Most tokens per completion."""
    top_p: float = Field(default=1.0, gt=0, le=1)
    """Nucleus sampling mass."""

    def as_dict(self) -> dict[str, Any]:
        """The fields as the gateway's forced sampling parameters."""
        return {"temperature": self.temperature, "max_tokens": self.max_tokens, "top_p": self.top_p}


class EvaluationOptions(_Group):
    """Held-out evaluation (on ``Trainer.fit``'s ``val`` tasks)."""

    every: int | None = Field(default=10, ge=0)
    """Evaluate every this many steps (and before and after training); ``None`` or 0: only before and after."""
    before: bool = True
    """Evaluate before the first step (``False``: skip it, e.g. when a previous stage just measured
    these weights; ``accuracy_before`` is then ``None``)."""
    samples: int = Field(default=1, ge=1)
    """Rollouts per held-out task."""
    temperature: float | None = Field(default=None, ge=0)
    """Held-out sampling temperature (``None``: the training temperature)."""
    success_threshold: float = 1.0
    """A rollout counts as correct when its final reward is at least this (training accuracy too)."""


class PolicyOptions(_Group):
    """How the policy is loaded."""

    lora: Any = None
    """:class:`~agentbolt_torch.adapters.LoraSettings` or a mapping of its fields (``None``: full
    fine-tune)."""
    autocast: str | None = "auto"
    """``"auto"`` (bf16 where the hardware runs it fast, else fp32), ``"bfloat16"``, ``"float16"``
    or ``None`` (fp32), for generation and the update."""
    device: str = "cpu"
    """``"cpu"`` or ``"cuda"``."""


class GenerationOptions(_Group):
    """The generator that serves the policy (:mod:`agentbolt_torch.generation`)."""

    generator: Literal["own", "vllm"] = "own"
    """``"own"``: agentbolt's engine in this process
    (:class:`~agentbolt_torch.serving.local.LocalGenerator`); ``"vllm"``: a vLLM server the run
    starts and owns (:class:`~agentbolt_torch.serving.vllm.VLLMGenerator`; vLLM installed in its
    own environment, see the package README); docs/generators.md compares them."""
    vllm: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of :class:`~agentbolt_torch.serving.vllm.VLLMGenerator` (``work_dir``
    defaults to ``out_dir/vllm``, where the server log ``vllm.log`` goes); ``generator="vllm"``
    only."""
    engine: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of :class:`~agentbolt_torch.generation.engine.GenerationEngine`
    (``max_batch_size`` defaults to ``max(batch_size * group_size, 8)``); ``generator="own"``
    only: with ``"vllm"`` they would configure an engine that never runs, so they are refused."""
    swap: Literal["inplace", "drain"] = "inplace"
    """Asynchronous training (``lightningrl.max_staleness`` set): how new weights reach the policy
    server after an update, ``"inplace"`` (between two decode steps; calls in flight go on with the
    new weights and keep the version they started with) or ``"drain"`` (the gateway and the server
    let calls in flight finish first); see :mod:`agentbolt_torch.training.asynchronous`."""

    @model_validator(mode="after")
    def _options_of_the_generator_used(self) -> Self:
        """Options of the generator the run does not start are an error, not silently ignored."""
        if self.generator == "vllm" and self.engine:
            hints = [f"{k} -> {_VLLM_EQUIVALENT[k]}" for k in sorted(self.engine) if k in _VLLM_EQUIVALENT]
            raise ValueError(
                f"engine configures agentbolt's own engine, which generator='vllm' does not start; "
                f"got {', '.join(sorted(self.engine))}: drop them, and set the vLLM server's options in "
                "generation.vllm (VLLMGenerator's keywords: max_num_seqs, max_model_len, kv_cache_gb, "
                "logprobs_mode, dtype, extra_args for any other vLLM flag)"
                + (f"; equivalents: {', '.join(hints)}" if hints else "")
            )
        if self.generator == "own" and self.vllm:
            raise ValueError(
                f"vllm configures the vLLM generator, which generator='own' does not start; got "
                f"{', '.join(sorted(self.vllm))}: set generator='vllm' to use vLLM, or drop generation.vllm"
            )
        return self


_VLLM_EQUIVALENT = {
    "max_batch_size": "generation.vllm max_num_seqs",
    "logprobs_mode": "generation.vllm logprobs_mode",
    "seed": "TorchGRPO(seed=...), which seeds vLLM too",
}
"""What an own-engine option is called where a vLLM run takes it."""


class OutputOptions(_Group):
    """Where a run writes, and what it resumes from."""

    out_dir: str | Path | None = None
    """Metrics, curve and checkpoints (``None``: ``runs/<algorithm name>``)."""
    checkpoint_every: int | None = Field(default=None, ge=0)
    """Save a checkpoint every this many steps (and at the end) if set (``None`` or 0: never)."""
    resume: str | Path | None = None
    """A checkpoint directory to start from."""
    plot: bool = True
    """Draw ``out_dir/curve.png`` at the end."""
