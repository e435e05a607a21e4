"""The suite's xdist groups take effect (tests/conftest.py): under ``--dist loadgroup`` every test
of a file runs on one worker, so a file's module fixtures start once. With pytest 9.2 and
pytest-xdist 3.8, xdist's own way of passing groups to its scheduler is lost (pytest-xdist issue
#1386): the tests of a file were spread over the workers, each starting the file's fixtures."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FILES = ("tests/core/test_evaluation.py", "tests/core/test_gateway_timers.py")


def test_each_file_runs_on_one_worker() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v", "-p", "no:cacheprovider", *FILES],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    workers: dict[str, set[str]] = defaultdict(set)
    for worker, path in re.findall(r"\[(gw\d+)\] \[ *\d+%\] PASSED (\S+?\.py)::", done.stdout):
        workers[path].add(worker)
    assert set(workers) == set(FILES), done.stdout[-3000:]
    spread = {path: sorted(w) for path, w in workers.items() if len(w) > 1}
    assert not spread, f"a file's tests ran on several workers: {spread}"
