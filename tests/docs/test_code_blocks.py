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
import itertools
import os
import shutil
import sqlite3
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI
from pytest_codeblocks import extract_from_file

from agentbolt import types as t
from agentbolt.algorithm import Algorithm, AlgorithmContext
from agentbolt.options import CaptureOptions, RunnerOptions
from agentbolt.testing.fake_llm import FakeLLM, FakeLLMServer, FakeRequest, Rule
from agentbolt.trainer import Trainer

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
BLOCK_TIMEOUT_S = 600  # generous: a loaded or AVX2-only CI machine runs each CLI start slowly


# -- the store the blocks read as sqlite:///runs.db -------------------------------------------------


async def answer_agent(task: dict[str, Any], resources: t.Resources) -> float:
    assert resources.llm is not None
    headers = {"X-Agentbolt-Agent-Name": "write_query"}  # the role the docs' agent_match examples select
    async with AsyncOpenAI(
        base_url=resources.llm.base_url, api_key="x", max_retries=0, default_headers=headers
    ) as client:
        reply = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": task["question"]}]
        )
    words = (reply.choices[0].message.content or "").split()
    return 1.0 if words and words[0] == str(task["answer"]) else 0.0


class TwoSteps(Algorithm):
    """Held-out rollouts, two steps of training rollouts in groups of two, held-out again."""

    name = "docs-two-steps"

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream

    async def run(self, ctx: AlgorithmContext, train: list[t.Task], val: list[t.Task]) -> None:
        await asyncio.to_thread(ctx.gateway.set_upstreams, [self.upstream])
        await ctx.publish(t.Resources(llm=t.LLMEndpoint(base_url=ctx.gateway_url, model="fake-model")))
        await ctx.run_rollouts(val, mode=t.RolloutMode.VAL, tag="val0", step=0)
        for step in (1, 2):
            rollouts = await ctx.run_rollouts(train, group_size=2, tag=f"step{step}", step=step)
            rewards = [r.final_reward or 0.0 for r in rollouts]
            ctx.log_metrics(step, {"train/reward": sum(rewards) / len(rewards)})
        await ctx.run_rollouts(val, mode=t.RolloutMode.VAL, tag="val2", step=2)


@pytest.fixture(scope="session")
def docs_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file holding one finished run: held-out rollouts, two training steps, held-out again."""
    path = tmp_path_factory.mktemp("docs-store") / "runs.db"
    tasks = [{"task_id": f"q{i}", "question": f"What is {i} + {i}?", "answer": 2 * i} for i in range(4)]
    drafts = itertools.count()  # samples differ, as a sampling policy's do

    def reply(request: FakeRequest) -> str:
        return f"{'2' if '1 + 1' in request.text else 'no idea'} (draft {next(drafts)})"

    llm = FakeLLM(rules=[Rule(reply=reply)])
    with FakeLLMServer(llm) as server:
        trainer = Trainer(
            answer_agent,
            TwoSteps(server.base_url),
            store=f"sqlite:///{path}",
            runners=RunnerOptions(n=0),
            progress=False,
            capture=CaptureOptions(adapters=[]),
        )
        trainer.fit(tasks[:2], tasks[2:])
    snapshot = path.with_name("snapshot.db")  # one self-contained file to copy (nothing left in a -wal beside it)
    with sqlite3.connect(path) as source, sqlite3.connect(snapshot) as target:
        source.backup(target)
    return snapshot


# -- the blocks ------------------------------------------------------------------------------------


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
