"""agentbolt-torch: single-process RL for small models on CPU or one GPU.

The pieces, each usable on its own:

- :mod:`~agentbolt_torch.models`: load a Hugging Face directory or the bundled SmolLM2
  (``"smollm2"``), or build a tiny random model for tests (``"tiny"``);
- :class:`~agentbolt_torch.policy.Policy`: the model being trained, its tokenizer, version and
  the lock shared by generation and updates (optionally with LoRA adapters);
- :class:`~agentbolt_torch.generation.engine.GenerationEngine`: continuous-batching sampler with exact
  token ids and logprobs;
- :class:`~agentbolt_torch.serving.server.PolicyServer`: the OpenAI-compatible HTTP server over it;
- :class:`~agentbolt_torch.update.updater.PolicyUpdater`: PPO-clip / GRPO update from transitions,
  checkpoints;
- :mod:`~agentbolt_torch.training.metrics`: JSONL metrics, progress, reward/accuracy curves.

Importing this package is cheap; torch and transformers load when a name below is first used.
"""

from __future__ import annotations

from agentbolt._lazy import lazy_exports

__all__ = [
    "Completion",
    "GenerationEngine",
    "LoraSettings",
    "MetricsLogger",
    "Policy",
    "PolicyServer",
    "PolicyUpdater",
    "SamplingParams",
    "UpdateConfig",
    "UpdateMetrics",
    "load_model",
    "plot_curves",
    "tiny_model",
]

_LAZY = {
    "Completion": "generation.engine",
    "GenerationEngine": "generation.engine",
    "SamplingParams": "generation.engine",
    "LoraSettings": "adapters",
    "Policy": "policy",
    "PolicyServer": "serving.server",
    "PolicyUpdater": "update.updater",
    "UpdateConfig": "update.updater",
    "UpdateMetrics": "update.updater",
    "MetricsLogger": "training.metrics",
    "plot_curves": "training.metrics",
    "load_model": "models",
    "tiny_model": "models",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
