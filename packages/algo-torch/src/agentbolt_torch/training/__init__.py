"""Training loops: ``torch-grpo`` (:mod:`.algorithm`, synchronous, and :mod:`.asynchronous`),
``torch-sft`` (:mod:`.sft`, with :mod:`.demonstrations`), per-role policies (:mod:`.roles`),
online learning (:mod:`.online`), and what a run records (:mod:`.run_state`, :mod:`.metrics`)."""

from __future__ import annotations

from agentbolt._lazy import lazy_exports

__all__ = ["TorchGRPO", "TorchGRPOResult", "TorchOnlinePolicy", "TorchSFT"]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {"TorchGRPO": "algorithm", "TorchGRPOResult": "algorithm", "TorchOnlinePolicy": "online", "TorchSFT": "sft"},
)
