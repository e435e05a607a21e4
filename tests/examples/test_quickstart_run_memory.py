"""The quickstart's run memory: this process and the processes it started, summed (GiB)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("quickstart_run_memory", REPO / "examples/quickstart/run_memory.py")
assert spec is not None and spec.loader is not None
run_memory = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = run_memory
spec.loader.exec_module(run_memory)

CHILD_MIB = 256
CHILD = f"""
import sys, time
block = b"\\x01" * ({CHILD_MIB} * 2**20)  # touched pages: resident
print("ready", flush=True)
sys.stdin.readline()
"""


def test_a_child_process_is_counted_in_the_run_peak() -> None:
    with run_memory.RunMemory(interval_s=0.05) as memory:
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        try:
            assert child.stdout is not None and child.stdout.readline().strip() == "ready"
            # while the child holds its block, the tree's RSS includes it
            total, processes = run_memory.tree_rss()
            assert processes >= 2 and total >= CHILD_MIB * 2**20
            memory._sample()  # at least one sample while it is alive, whatever the thread's timing
        finally:
            assert child.stdin is not None
            child.stdin.write("\n")
            child.stdin.flush()
            child.wait(timeout=30)
    peak = memory.peak
    assert peak.processes >= 2 and peak.samples >= 2
    assert peak.tree_gib >= CHILD_MIB / 1024 + 0.01  # the child's block plus this process
    assert peak.self_maxrss_gib > 0


def test_the_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="interval_s must be > 0"):
        run_memory.RunMemory(interval_s=0)
