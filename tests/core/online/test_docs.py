"""docs/online.md's quick start is examples/online/serve_and_feedback.py, and it runs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "online" / "serve_and_feedback.py"


def test_the_quick_start_block_is_the_example_and_it_runs(tmp_path: Path) -> None:
    doc = (ROOT / "docs" / "online.md").read_text()
    first_block = re.search(r"```python\n(.*?)```", doc, re.DOTALL)
    assert first_block is not None and first_block.group(1) == EXAMPLE.read_text()
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)], cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["Paris.", "recorded", "1.0"]
    assert (tmp_path / "serve.db").exists() and (tmp_path / "serve-state" / "ledger.jsonl").exists()
