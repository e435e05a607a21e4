"""The verifiers environments of these tests (tests/verifiers/vf_envs) are importable packages:
on sys.path for this process, on PYTHONPATH for the processes verifiers starts (tool servers)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ENVS = Path(__file__).parent / "vf_envs"


@pytest.fixture(autouse=True)
def vf_envs_importable(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.syspath_prepend(str(ENVS))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ENVS), *filter(None, [os.environ.get("PYTHONPATH")])]))
    yield
    for name in [m for m in sys.modules if m.split(".")[0] in {"arith_env", "adder_tools_env", "exported_calc_env"}]:
        del sys.modules[name]
