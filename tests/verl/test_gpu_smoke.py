"""GPU only: two real verl V1 steps of Qwen2.5-0.5B-Instruct through the binding.

Skipped on machines without CUDA and vLLM (see conftest.py). Runs
``packages/algo-verl/scripts/gpu_smoke.sh``, which also needs agentbolt's gateway and runner
commands and a model download (or a local model path in the example config).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "packages" / "algo-verl" / "scripts" / "gpu_smoke.sh"


@pytest.mark.gpu
@pytest.mark.slow
def test_two_verl_steps_on_one_gpu(tmp_path) -> None:
    if shutil.which("agentbolt") is None:
        pytest.skip("the agentbolt command is not installed")
    env = {**os.environ, "WORK": str(tmp_path), "STEPS": "2", "SKIP_INSTALL": os.environ.get("SKIP_INSTALL", "1")}
    out = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=3600)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert "agentbolt-verl smoke: OK" in out.stdout
