"""Handing free memory back between training phases (``agentbolt_torch.allocator``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentbolt_torch.allocator import release_free_memory

TCMALLOC = Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")

FREE_THEN_RELEASE = """
import gc
from agentbolt_torch.allocator import release_free_memory

def rss_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024

blocks = [bytearray(4 << 20) for _ in range(100)]  # 400 MB, touched
del blocks
gc.collect()
kept = rss_mb()
released = release_free_memory()
print(released, round(kept - rss_mb()))
"""


def test_without_tcmalloc_nothing_is_done() -> None:
    if "tcmalloc" in Path("/proc/self/maps").read_text():
        pytest.skip("this test process runs on tcmalloc")
    assert release_free_memory() is False


@pytest.mark.skipif(
    not TCMALLOC.exists(), reason="Debian's libtcmalloc-minimal4 is not installed (./dev test installs it as root)"
)
def test_under_tcmalloc_freed_pages_go_back_to_the_system() -> None:
    env = {**os.environ, "LD_PRELOAD": str(TCMALLOC), "TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD": str(1 << 40)}
    out = subprocess.run([sys.executable, "-c", FREE_THEN_RELEASE], env=env, capture_output=True, text=True, check=True)
    released, returned_mb = out.stdout.split()
    assert released == "True"
    assert int(returned_mb) > 300  # of the 400 MB freed, kept by tcmalloc until released
