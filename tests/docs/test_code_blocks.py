"""Every code block of the READMEs and docs/ runs, so documented commands and APIs cannot go stale.

Blocks are read with pytest-codeblocks' parser and follow its marking convention: a block that
must not run here carries, on the line before it, an HTML comment (invisible on GitHub) naming
the mark and the reason, e.g. ``<!--pytest.mark.skip(reason="long run: trains SmolLM2 for 10 minutes")-->``.
Every skip must say why. The rest run:

- ``python`` blocks execute in a fresh namespace whose ``__name__`` is not ``"__main__"`` (so an
  ``if __name__ == "__main__":`` training run is defined, imported and checked, not started);
  top-level ``await`` runs on an event loop;
- ``bash`` / ``sh`` blocks run with ``bash -euo pipefail`` and this environment's ``agentbolt``
  on ``PATH``;
- ``toml`` blocks must parse;

each in a temporary working directory that holds ``runs.db``: a store with one finished run
(training and held-out rollouts of the fake LLM through the real Trainer, gateway and runner).
A snippet that uses names the page does not define gets them from a setup block hidden in an
HTML comment just before it, continued by ``<!--pytest-codeblocks:cont-->``. Skipped python
blocks must still compile. Blocks without a language (diagrams, printed output) and ``markdown`` examples are not code.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from pytest_codeblocks import extract_from_file

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted(
    {
        ROOT / "README.md",
        *ROOT.glob("docs/*.md"),
        *ROOT.glob("examples/*/README.md"),
        *ROOT.glob("packages/*/README.md"),
    }
)
RUNNABLE = {"python", "bash", "sh", "toml"}
NOT_CODE = {"", "text", "console", "output", "markdown"}
BLOCK_TIMEOUT_S = 120


def _blocks() -> list[Any]:
    params = []
    for path in DOCS:
        for block in extract_from_file(path):
            marks = [eval(mark, {"pytest": pytest, "sys": sys}) for mark in block.marks]
            name = f"{path.relative_to(ROOT)}:{block.lineno}"
            params.append(pytest.param(path, block, id=name, marks=marks))
    return params


BLOCKS = _blocks()


def test_the_docs_have_code_blocks() -> None:
    assert len(DOCS) >= 10 and sum(p.values[1].syntax in RUNNABLE for p in BLOCKS) >= 30


@pytest.mark.parametrize(("path", "block"), [p for p in BLOCKS if p.values[1].syntax not in NOT_CODE])
def test_code_block(path: Path, block: Any, tmp_path: Path, docs_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    where = f"{path.relative_to(ROOT)}, line {block.lineno}"
    assert block.syntax in RUNNABLE, (
        f"{where}: a ```{block.syntax} block cannot run here; mark it "
        '<!--pytest.mark.skip(reason="...")--> or give it a language this test runs'
    )
    monkeypatch.chdir(tmp_path)
    shutil.copy(docs_store, tmp_path / "runs.db")
    if block.syntax == "toml":
        tomllib.loads(block.code)
    elif block.syntax == "python":
        monkeypatch.syspath_prepend(str(tmp_path))
        code = _compile(block.code, where)
        namespace = {"__name__": "__docs__"}
        if code.co_flags & inspect.CO_COROUTINE:
            asyncio.run(eval(code, namespace))
        else:
            exec(code, namespace)
    else:
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        env.pop("AGENTBOLT_STORE", None)
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", block.code],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=BLOCK_TIMEOUT_S,
            check=False,
        )
        assert done.returncode == 0, (
            f"{where} exited {done.returncode}:\n{block.code}\n--- stdout\n{done.stdout[-3000:]}\n"
            f"--- stderr\n{done.stderr[-3000:]}"
        )


def _compile(source: str, where: str) -> Any:
    return compile(source, where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)


def test_skipped_python_blocks_compile() -> None:
    skipped = [p for p in BLOCKS if p.values[1].syntax == "python" and any(m.name == "skip" for m in p.marks)]
    for p in skipped:
        _compile(p.values[1].code, p.id)


def test_every_skipped_block_says_why() -> None:
    unexplained = [
        p.id
        for p in BLOCKS
        for mark in p.marks
        if mark.name in ("skip", "skipif", "xfail") and not str(mark.kwargs.get("reason", "")).strip()
    ]
    assert not unexplained, f"give these blocks' marks a reason=...: {unexplained}"
