"""Shared by the tests that start a real vLLM server (marked ``vllm``): the skip when vLLM's
environment is missing (a failure with ``CI`` set, unless ``AGENTBOLT_TEST_VLLM=0``), and a tiny model vLLM's CPU attention can run (head size 32; the default
tiny model's 16 is below the sizes vLLM's CPU backend supports: 32, 64, 80, ...)."""

from __future__ import annotations

import os
from typing import Any

import pytest

from agentbolt.errors import UserError
from agentbolt.testing.requirements import in_ci


def vllm_python_or_skip() -> str:
    """The interpreter with vLLM, or skip the module saying how to get one."""
    from agentbolt_torch.serving.vllm_process import find_vllm_python

    try:
        return find_vllm_python()
    except UserError as exc:
        if in_ci() and os.environ.get("AGENTBOLT_TEST_VLLM", "1") != "0":  # ./dev test builds it: CI cannot skip these
            pytest.fail(f"no vLLM: {exc}; with CI set these tests fail (AGENTBOLT_TEST_VLLM=0 leaves them out)")
        pytest.skip(f"no vLLM: {exc}", allow_module_level=True)
        raise  # unreachable


def vllm_tiny(seed: int = 0) -> tuple[Any, Any]:
    """The tiny random Llama with a head size vLLM's CPU backend supports (32)."""
    from agentbolt_torch.models import tiny_model

    return tiny_model(seed=seed, hidden_size=64, num_heads=2, num_kv_heads=1)


def serving_part(log: str) -> str:
    """A vLLM server log up to its shutdown (the first ``[shutdown]`` line): what it logged while it
    served. On SIGTERM vLLM stops its engine in ``abort`` mode with no grace period, and its API
    server can then log an ``EngineDeadError`` traceback while it exits; a traceback before that is
    an error of the run."""
    index = log.find("[shutdown]")
    return log if index < 0 else log[: log.rfind("\n", 0, index) + 1]
