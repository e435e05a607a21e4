"""Plugin entry module: registers agentbolt-torch's algorithms (cheap to import: torch loads later)."""

from __future__ import annotations

from typing import Any

from agentbolt import hookimpl
from agentbolt.plugins import Register


def _torch_grpo(**config: Any) -> Any:
    from .training.algorithm import TorchGRPO

    return TorchGRPO(**config)


def _torch_sft(**config: Any) -> Any:
    from .training.sft import TorchSFT

    return TorchSFT(**config)


def _torch_traced_rl(**config: Any) -> Any:
    from .training.traced_rl import TorchTracedRL

    return TorchTracedRL(**config)


@hookimpl
def agentbolt_register_algorithms(register: Register) -> None:
    register("torch-grpo", _torch_grpo)
    register("torch-sft", _torch_sft)
    register("torch-traced-rl", _torch_traced_rl)
