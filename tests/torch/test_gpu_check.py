"""scripts/gpu_check.sh (the prepared GPU check): its Python part runs end to end on CPU, and the
shell script stops loudly on a machine without CUDA. The CUDA run itself is unrun in CI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]


def test_gpu_check_python_part_runs_on_cpu() -> None:
    """Without vLLM (the workspace's Python has none, and no $AGENTBOLT_VLLM_PYTHON): every other
    part runs, and the output says the vLLM generator could not (tests/torch/test_vllm_gpu_check.py
    runs it with vLLM)."""
    env = {k: v for k, v in os.environ.items() if k != "AGENTBOLT_VLLM_PYTHON"}
    done = subprocess.run(
        [sys.executable, "scripts/gpu_check.py", "--device", "cpu", "--quick"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("gpu_check:")]
    assert done.returncode == 0, done.stdout + done.stderr
    assert lines[-1] == "gpu_check: ok"
    (not_run,) = [line for line in lines if line.startswith("gpu_check: vllm: not run:")]
    assert "vLLM is not installed" in not_run and "AGENTBOLT_VLLM_PYTHON" in not_run
    assert any("torch-grpo synchronous: 2 steps" in line and "policy version 2" in line for line in lines)
    assert any("asynchronous (max_staleness=1): 2 steps" in line for line in lines)
    assert any(line.startswith("gpu_check: engine: 32 concurrent requests") for line in lines)


def test_gpu_check_lists_nothing_missing_in_the_workspace_environment() -> None:
    done = subprocess.run(
        [sys.executable, "scripts/gpu_check.py", "--missing"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert (done.returncode, done.stdout) == (0, "")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_gpu_check_script_refuses_a_machine_without_cuda() -> None:
    done = subprocess.run(
        ["bash", "scripts/gpu_check.sh"],
        cwd=REPO,
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert "FAILED" in done.stderr and "sees no CUDA device" in done.stderr
    assert "scripts/gpu_check.py --device cpu --quick" in done.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_gpu_check_python_part_refuses_cuda_without_a_device() -> None:
    done = subprocess.run(
        [sys.executable, "scripts/gpu_check.py", "--device", "cuda"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 3
    assert "no CUDA device visible" in done.stdout and "--device cpu" in done.stdout
