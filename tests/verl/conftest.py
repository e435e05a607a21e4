"""Fixtures for agentbolt-verl's CPU tests.

verl's agent-loop modules import ``cachetools`` at module level (``verl/workers/rollout/
router.py``); it ships with verl's ``verl-core`` extra, which the CPU dev environment does not
install. When it is missing, a minimal LRU stand-in is registered so that verl's
``AgentLoopBase`` and ``ray_trainer.compute_advantage`` can be imported and exercised here. A
GPU install (``verl[vllm,fsdp]``) has the real package and never uses this.
"""

from __future__ import annotations

import sys
import types
from collections import OrderedDict
from typing import Any

import pytest

try:  # pragma: no cover - depends on the environment
    import cachetools  # noqa: F401
except ImportError:  # pragma: no cover

    class _LRUCache(OrderedDict):
        def __init__(self, maxsize: int = 128, *args: Any, **kwargs: Any) -> None:
            super().__init__()
            self.maxsize = maxsize

        def __getitem__(self, key: Any) -> Any:
            value = super().__getitem__(key)
            self.move_to_end(key)
            return value

        def __setitem__(self, key: Any, value: Any) -> None:
            super().__setitem__(key, value)
            self.move_to_end(key)
            while len(self) > self.maxsize:
                self.popitem(last=False)

    _stub = types.ModuleType("cachetools")
    _stub.LRUCache = _LRUCache  # type: ignore[attr-defined]
    _stub.__agentbolt_test_stub__ = True  # type: ignore[attr-defined]
    sys.modules["cachetools"] = _stub


def _has_cuda_stack() -> bool:
    try:
        import torch

        if not torch.cuda.is_available():
            return False
        import vllm  # noqa: F401
    except Exception:
        return False
    return True


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = str(__file__).rsplit("/", 1)[0]
    gpu_items = [i for i in items if "gpu" in i.keywords and str(i.fspath).startswith(here)]
    if not gpu_items or _has_cuda_stack():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU with verl[vllm,fsdp]==0.9.1 (see packages/algo-verl/README.md)")
    for item in gpu_items:
        item.add_marker(skip)
