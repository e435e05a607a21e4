"""Every code block of the READMEs and docs/ runs, so documented commands and APIs cannot go stale.

Blocks are read with pytest-codeblocks' parser and follow its marking convention: a block that
must not run here carries, on the line before it, an HTML comment (invisible on GitHub) naming
the mark and the reason, e.g. ``<!--pytest.mark.skip(reason="long run: trains SmolLM2 for 10 minutes")-->``.
Every skip must say why. The rest run:

- ``python`` blocks execute in a Python process of their own (what they set up, e.g. an
  instrumentor, never leaks into the test session), in a namespace whose ``__name__`` is not
  ``"__main__"`` (so an ``if __name__ == "__main__":`` training run is defined, imported and
  checked, not started); top-level ``await`` runs on an event loop;
- ``bash`` / ``sh`` blocks run with ``bash -euo pipefail`` and this environment's ``agentbolt``
  on ``PATH``;
- ``toml`` blocks must parse;

each in a temporary working directory that holds ``runs.db``: a store with one finished run
(training and held-out rollouts of the fake LLM through the real Trainer, gateway and runner).
A snippet that uses names the page does not define gets them from a setup block hidden in an
HTML comment just before it, continued by ``<!--pytest-codeblocks:cont-->``. Skipped python
blocks must still compile. Blocks without a language (diagrams, printed output) and ``markdown`` examples are not code.

A block that needs more than that says how it runs here, on the line before it, with
``<!--pytest.mark.ci(...)-->`` (invisible on GitHub; the test prints what it changed):

- ``clone=True``: run in a copy of the repository (its tracked and unignored files), for commands
  that read the repository's files (``uv run python benchmarks/x.py --report docs/runs/...``);
  ``uv run`` uses this environment without syncing;
- ``replace={"old": "new", ...}``: text substituted before the block runs, to run a documented
  command on a CI budget (the tiny model, one step) or against the fake LLM; every ``old`` must
  occur in the block;
- ``serve="http://127.0.0.1:PORT/..."``: the block starts a server that runs until stopped: it
  runs in its own process group until that URL answers (any HTTP status below 500), then is
  stopped; it fails if the server exits first or never answers;
- ``{fake_llm}`` in a replacement is the base URL (``.../v1``) of a fake OpenAI-compatible server
  (``agentbolt.testing``) running for the session, for commands that need a model endpoint;
  ``{postgres}`` is the URL of the session's throwaway PostgreSQL (``tests/conftest.py``) with a
  schema of the block's own, for commands that need a database;
- ``main=True``: a python block with an ``if __name__ == "__main__":`` guard runs as a script, so
  the guarded code runs too. A python block with such a guard must say ``main=True`` (a block that
  only defines what it never calls is not tested).

At least :data:`FLOOR` of the runnable blocks (``python``, ``bash``, ``sh``, ``toml``) execute; a
skipped block never counts, and ``test_most_runnable_blocks_execute`` prints the count.
"""

from __future__ import annotations

import ast
import asyncio
import itertools
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from docs_figures import doc_files
from openai import AsyncOpenAI
from pytest_codeblocks import extract_from_file

from agentbolt import types as t
from agentbolt.algorithm import Algorithm, AlgorithmContext
from agentbolt.options import CaptureOptions, RunnerOptions
from agentbolt.testing.fake_llm import FakeLLM, FakeLLMServer, FakeRequest, Rule
from agentbolt.trainer import Trainer

ROOT = Path(__file__).resolve().parents[2]
DOCS = doc_files(ROOT)
"""The same files whose figures test_figures.py checks."""
RUNNABLE = {"python", "bash", "sh", "toml"}
NOT_CODE = {"", "text", "console", "output", "markdown"}
BLOCK_TIMEOUT_S = 600  # generous: a loaded or AVX2-only CI machine runs each CLI start slowly
FLOOR = 0.80  # 114 of 140 (81 %) after issue 40 (ingest, traces, verifiers export, baselines, store server)
"""The share of runnable blocks that must execute (skipped ones never count)."""
RUN_PYTHON_BLOCK = """
import ast, asyncio, inspect, sys

path = sys.argv[1]
with open(path) as f:
    code = compile(f.read(), path, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)
namespace = {"__name__": "__docs__", "__file__": path}
if code.co_flags & inspect.CO_COROUTINE:
    asyncio.run(eval(code, namespace))
else:
    exec(code, namespace)
"""
"""Runs one python block (``python -c RUN_PYTHON_BLOCK FILE``): top-level ``await`` allowed, and
``__name__`` is not ``"__main__"``."""


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


def _skipped(param: Any) -> bool:
    return any(mark.name in ("skip", "skipif") for mark in param.marks)


def test_most_runnable_blocks_execute(capsys: pytest.CaptureFixture[str]) -> None:
    """Skipped blocks never count toward the floor."""
    runnable = [p for p in BLOCKS if p.values[1].syntax in RUNNABLE]
    executed = [p for p in runnable if not _skipped(p)]
    with capsys.disabled():
        print(f"\n{len(executed)} of {len(runnable)} runnable code blocks execute in CI ({len(DOCS)} files)")
    assert len(DOCS) >= 10 and len(executed) >= FLOOR * len(runnable), (
        f"only {len(executed)} of {len(runnable)} runnable blocks execute (floor {FLOOR:.0%}): run more of them "
        "(see the ci mark in this file's docstring) instead of skipping"
    )


def test_a_block_with_a_main_guard_runs_it() -> None:
    unmarked = [
        p.id
        for p in BLOCKS
        if p.values[1].syntax == "python"
        and not _skipped(p)
        and re.search(r"^if __name__ == .__main__.:", p.values[1].code, re.M)
        and not any(m.name == "ci" and m.kwargs.get("main") for m in p.marks)
    ]
    assert not unmarked, (
        f"these blocks define code behind a __main__ guard that CI never runs; mark them ci(main=True): {unmarked}"
    )


def _clone(target: Path) -> Path:
    """A copy of the repository's tracked and unignored files (what a clean clone plus this
    checkout's uncommitted work holds), for blocks that read the repository."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


# a loaded machine gets the block's own limit (BLOCK_TIMEOUT_S), not pytest-timeout's shorter default,
# which interrupts the test and leaves the block's processes running
@pytest.mark.timeout(BLOCK_TIMEOUT_S + 60)
@pytest.mark.parametrize(("path", "block"), [p for p in BLOCKS if p.values[1].syntax not in NOT_CODE])
def test_code_block(
    path: Path,
    block: Any,
    tmp_path: Path,
    docs_store: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    where = f"{path.relative_to(ROOT)}, line {block.lineno}"
    assert block.syntax in RUNNABLE, (
        f"{where}: a ```{block.syntax} block cannot run here; mark it "
        '<!--pytest.mark.skip(reason="...")--> or give it a language this test runs'
    )
    ci = request.node.get_closest_marker("ci")
    options = dict(ci.kwargs) if ci is not None else {}
    code = block.code
    for old, new in options.get("replace", {}).items():
        assert old in code, f"{where}: ci(replace=...) names {old!r}, which the block does not hold"
        if "{fake_llm}" in new:
            new = new.replace("{fake_llm}", request.getfixturevalue("fake_llm_url"))
        if "{postgres}" in new:
            schema = "docs_" + re.sub(r"\W", "_", f"{path.relative_to(ROOT)}_{block.lineno}").lower()
            new = new.replace("{postgres}", f"{request.getfixturevalue('postgres_url')}?schema={schema}")
        code = code.replace(old, new)
    if code != block.code:
        print(f"{where} runs with {options['replace']}")
    cwd = _clone(tmp_path / "repo") if options.get("clone") else tmp_path
    monkeypatch.chdir(cwd)
    shutil.copy(docs_store, cwd / "runs.db")
    if block.syntax == "toml":
        tomllib.loads(code)
    elif block.syntax == "python":
        source = cwd / "code_block.py"  # a file, so inspect.getsource works (smolagents' @tool reads it)
        source.write_text(code)
        command = (
            [sys.executable, str(source)]
            if options.get("main")
            else [sys.executable, "-c", RUN_PYTHON_BLOCK, str(source)]
        )
        _check(where, code, command, cwd)
    elif options.get("serve"):
        _serve(where, code, options["serve"], cwd)
    else:
        _check(where, code, ["bash", "-euo", "pipefail", "-c", code], cwd)


@pytest.fixture(scope="session")
def fake_llm_url() -> Iterator[str]:
    """The fake OpenAI-compatible backend's base URL, for blocks that need a model endpoint."""
    with FakeLLMServer(FakeLLM()) as server:
        yield server.base_url


def _env() -> dict[str, str]:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env |= {"UV_PROJECT_ENVIRONMENT": sys.prefix, "UV_NO_SYNC": "1", "UV_OFFLINE": "1"}
    env.pop("AGENTBOLT_STORE", None)
    return env


def _serve(where: str, code: str, url: str, cwd: Path, timeout_s: float = 120.0) -> None:
    """Start a block that serves until stopped, wait until ``url`` answers, stop it."""
    log = cwd / "serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            ["bash", "-euo", "pipefail", "-c", code],
            cwd=cwd,
            env=_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + timeout_s
        status = None
        while time.monotonic() < deadline and process.poll() is None:
            try:
                status = httpx.get(url, timeout=5.0).status_code
                break
            except httpx.HTTPError:
                time.sleep(0.5)
        assert process.poll() is None, f"{where}: the server exited ({process.returncode}):\n{log.read_text()[-3000:]}"
        assert status is not None and status < 500, f"{where}: {url} answered {status}:\n{log.read_text()[-3000:]}"
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def _check(where: str, code: str, command: list[str], cwd: Path) -> None:
    """Run one block in its own process (what a block sets up, e.g. an instrumentor or a tracer
    provider, never leaks into the test session) with this environment's ``agentbolt`` on PATH;
    ``uv run`` in the block uses this environment as it is (no sync, no network)."""
    env = _env()
    done = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S, check=False
    )
    assert done.returncode == 0, (
        f"{where} exited {done.returncode}:\n{code}\n--- stdout\n{done.stdout[-3000:]}\n"
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
