"""Reliability suite: crashes, fuzzing, hijack attempts, broken upstreams and broken agents.

Run:  uv run python benchmarks/reliability.py [--quick] [--rows R1,R3] [--rollouts 1000]

One row per scenario, each with its figures and whether it holds (exit code 1 if one does not):

- R1: rollouts on 4 runner processes while runner processes are killed with SIGKILL
  mid-rollout, about 13 kills per 1,000 rollouts (the pool replaces them): terminal, lost, run twice to success, duplicated
  transitions (reward spans in a rollout's final attempt beyond one).
- R2: the store server killed with SIGKILL while a client writes, restarted on the same SQLite
  file (and on PostgreSQL when its binaries exist): acknowledged writes missing, integrity check.
- R3: both servers fuzzed with schemathesis from their OpenAPI documents: responses >= 500,
  tracebacks in bodies, store consistent afterwards; plus an oversized body, deep JSON and a
  huge span batch.
- R4: servers bound beyond loopback without a token, missing/wrong tokens, cross-site and
  rebinding requests: every one refused.
- R5: upstream down, slow past the timeout, 500, non-JSON 200, wrong-shape 200, reset
  mid-stream: the agent gets an OpenAI-style error in time, the attempt is retried as
  infrastructure, nothing succeeds.
- R6: agents that raise, hang, block their loop, return garbage (a string, NaN, 1e308, True,
  10**400: refused, since a reward is a finite number of magnitude at most 1e15), never call the
  LLM, ask for a wrong model, or kill their runner process: each rollout ends with a clear
  outcome in time and a following rollout still succeeds.

``--quick`` runs small versions (the tests run R1 and R2 that way).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

import reliability_agents as agents

from agentbolt import types as t
from agentbolt.errors import UserError
from agentbolt.gateway import Gateway, GatewayThread
from agentbolt.runners.pool import RunnerPool
from agentbolt.runners.runner import Runner, RunnerConfig
from agentbolt.store import open_store
from agentbolt.store.server import ServerThread
from agentbolt.testing.bad_upstream import GarbageUpstream

Row = tuple[str, str, str, bool]  # id, scenario, figures, holds


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- R1 -------------------------------------------------------------------------------------------


def r1_runner_kills(n: int, workdir: Path) -> Row:
    url = f"sqlite:///{workdir}/r1.db"
    ids = [f"r1-{i:05d}" for i in range(n)]
    # About 13 kills per 1,000 rollouts, spread over the run: each "hold" rollout waits in its
    # runner process until that process is killed, so every kill lands mid-rollout (the other
    # rollouts in flight in the same process die with it), however fast the machine is.
    planned = max(1, round(n * 13 / 1000))
    holds_at = {round((k + 1) * n / (planned + 1)) for k in range(planned)}
    markers = {i: workdir / f"r1-hold-{i}.pid" for i in sorted(holds_at)}

    async def enqueue() -> None:
        store = open_store(url)
        specs = [
            t.RolloutSpec(rollout_id=rid, input={"hold": str(markers[i])} if i in markers else None, max_attempts=10)
            for i, rid in enumerate(ids)
        ]
        await store.enqueue(specs)
        await store.close()

    asyncio.run(enqueue())
    config = RunnerConfig(concurrency=8, lease_s=1.5, adapters=[], drain_timeout_s=5)
    pool = RunnerPool("reliability_agents:work", url, processes=4, config=config, max_restarts=10_000)
    pool.start()
    pool.wait_ready()
    handled: set[Path] = set()  # hold rollouts whose process was killed
    killed: set[int] = set()  # process ids killed (two hold rollouts may share one process)
    try:
        deadline = time.monotonic() + max(300, n)
        while time.monotonic() < deadline:
            pool.watch()
            for marker in markers.values():
                if marker in handled or not marker.exists():
                    continue
                pid = int(marker.read_text())
                if pid not in killed and pid in {p.pid for p in pool.processes if p.is_alive()}:
                    os.kill(pid, signal.SIGKILL)
                    killed.add(pid)
                if pid in killed:
                    handled.add(marker)
            counts = asyncio.run(_counts(url))
            if sum(v for k, v in counts.items() if k.is_final) >= n:
                break
            time.sleep(0.2)
    finally:
        pool.stop(timeout=20)
    kills = len(killed)
    summary = asyncio.run(_r1_summary(url, ids))
    figures = (
        f"{n} rollouts on 4 runner processes, {kills} runner processes killed -9 mid-rollout and replaced: {summary['terminal']} terminal "
        f"({summary['succeeded']} succeeded), {summary['lost']} lost, {summary['twice']} run twice to success, "
        f"{summary['duplicated']} duplicated transitions, {summary['retried']} requeued after a kill"
    )
    holds = (
        summary["lost"] == 0
        and summary["twice"] == 0
        and summary["duplicated"] == 0
        and summary["succeeded"] == n
        and kills > 0
        and len(handled) == planned
    )
    return "R1", "SIGKILL runner processes mid-rollout", figures, holds


async def _counts(url: str) -> dict[t.RolloutStatus, int]:
    store = open_store(url, sweep_interval_s=0)
    try:
        return await store.count_rollouts()
    finally:
        await store.close()


async def _r1_summary(url: str, ids: list[str]) -> dict[str, int]:
    store = open_store(url, sweep_interval_s=0)
    try:
        rollouts = await store.get_rollouts(ids)
        spans = await store.query_spans(ids, latest_attempt_only=True)
        twice = retried = 0
        for rid in ids:
            attempts = await store.get_attempts(rid)
            twice += sum(a.status is t.AttemptStatus.SUCCEEDED for a in attempts) > 1
            retried += len(attempts) > 1
        duplicated = sum(max(0, sum(s.name == "agentbolt.reward" for s in spans.get(r, [])) - 1) for r in ids)
        return {
            "terminal": sum(r.status.is_final for r in rollouts),
            "succeeded": sum(r.status is t.RolloutStatus.SUCCEEDED for r in rollouts),
            "lost": sum(not r.status.is_final for r in rollouts),
            "twice": twice,
            "duplicated": duplicated,
            "retried": retried,
        }
    finally:
        await store.close()


# -- R2 -------------------------------------------------------------------------------------------


def _serve(store_url: str, port: int) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "agentbolt.cli", "store", "serve", "--store", store_url, "--port", str(port)]
    log_path = Path(tempfile.gettempdir()) / f"agentbolt-reliability-server-{port}.log"
    with log_path.open("wb") as log:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/health", timeout=1).status_code == 200:
                log_path.unlink()
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    proc.wait()
    raise RuntimeError(f"the store server did not start: {log_path.read_text(errors='replace')[-2000:]}")


def _r2_one(store_url: str, seconds: float) -> tuple[int, int, int]:
    """(acknowledged, missing after restart, batches) for one kill -9 of the server."""
    port = _free_port()
    server = _serve(store_url, port)
    acked: list[str] = []
    batches = 0
    kill_at = time.monotonic() + seconds
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
        while True:
            ids = [f"r2-{batches}-{i}" for i in range(10)]
            if time.monotonic() >= kill_at and server.poll() is None:
                server.send_signal(signal.SIGKILL)  # mid-run: requests may be in flight
            try:
                answer = http.post("/v1/rollouts", json={"specs": [{"rollout_id": i} for i in ids]})
            except httpx.HTTPError:
                break
            if answer.status_code == 200:
                acked.extend(ids)
            batches += 1
    server.wait()
    port = _free_port()
    server = _serve(store_url, port)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            got = http.post("/v1/rollouts/get", json={"rollout_ids": acked})
            missing = len(acked) if got.status_code != 200 else len(acked) - len(got.json()["rollouts"])
    finally:
        server.terminate()
        server.wait(30)
    return len(acked), missing, batches


def r2_server_kills(workdir: Path, seconds: float, postgres: bool) -> Row:
    db = workdir / "r2.db"
    acked, missing, _ = _r2_one(f"sqlite:///{db}", seconds)
    conn = sqlite3.connect(db)
    integrity = conn.execute("PRAGMA integrity_check").fetchone()[0]
    conn.close()
    figures = f"SQLite: {acked} acknowledged, {missing} missing, integrity_check {integrity}"
    holds = missing == 0 and integrity == "ok" and acked > 0
    if postgres:
        from agentbolt.testing.postgres import find_postgres_bindir, throwaway_postgres

        if find_postgres_bindir() is None:
            figures += "; PostgreSQL: not measured (no binaries)"
        else:
            with throwaway_postgres() as pg_url:
                pg_acked, pg_missing, _ = _r2_one(pg_url, seconds)
            figures += f"; PostgreSQL: {pg_acked} acknowledged, {pg_missing} missing"
            holds = holds and pg_missing == 0 and pg_acked > 0
    return "R2", "SIGKILL the store server mid-run, restart", figures, holds


# -- R3 -------------------------------------------------------------------------------------------


def _fuzz(base_url: str, examples: int, exclude: str | None = None) -> tuple[int, int, int]:
    """(requests, responses >= 500 that are not upstream conditions, tracebacks)."""
    import schemathesis
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    if exclude:
        schema = schema.exclude(path_regex=exclude)
    tally = {"requests": 0, "5xx": 0, "tracebacks": 0}
    for result in schema.get_all_operations():
        operation = result.ok()

        @given(case=operation.as_strategy())
        @hypothesis_seed(20261125)
        @settings(
            max_examples=examples,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
            phases=[Phase.explicit, Phase.generate],
        )
        def run(case: Any) -> None:
            response = case.call()
            tally["requests"] += 1
            if response.status_code >= 500 and "agentbolt_upstream_error" not in response.text:
                tally["5xx"] += 1
            if "Traceback (most recent call last)" in response.text:
                tally["tracebacks"] += 1

        run()
    return tally["requests"], tally["5xx"], tally["tracebacks"]


def r3_fuzz(workdir: Path, examples: int) -> Row:
    db = workdir / "r3.db"
    with ServerThread(open_store(f"sqlite:///{db}"), close_store=True, max_wait_s=0.2) as server:
        s_req, s_5xx, s_tb = _fuzz(server.url, examples)
        with httpx.Client(base_url=server.url, timeout=120, headers={"content-type": "application/json"}) as http:
            oversized = http.post("/v1/rollouts", content=b"[" + b" " * (65 << 20) + b"]").status_code
            deep = http.post("/v1/rollouts", content=b"[" * 200_000).status_code
            rid = "r3-spans"
            http.post("/v1/rollouts", json={"specs": [{"rollout_id": rid}]})
            spans = [
                {"rollout_id": rid, "trace_id": "0" * 31 + "1", "span_id": f"{i:016x}", "name": "s", "start_time_ns": 1}
                for i in range(50_000)
            ]
            huge = http.post("/v1/spans", json={"spans": spans}).status_code
            consistent = http.get("/v1/rollouts/counts").status_code == 200
    conn = sqlite3.connect(db)
    integrity = conn.execute("PRAGMA integrity_check").fetchone()[0]
    conn.close()
    with GatewayThread("memory://", [], pause_timeout_s=0.5) as gw:
        g_req, g_5xx, g_tb = _fuzz(gw.url, examples, exclude="^/gateway/(drain|flush)$")
        with httpx.Client(base_url=gw.url, timeout=60) as http:
            g_big = http.post("/gateway/policy", json={"sampling": {"x": "a" * (65 << 20)}}).status_code
    figures = (
        f"store server: {s_req} requests, {s_5xx} >= 500, {s_tb} tracebacks, integrity_check {integrity}; "
        f"gateway: {g_req} requests, {g_5xx} >= 500, {g_tb} tracebacks; 65 MiB body -> {oversized} / {g_big}, "
        f"200,000-deep JSON -> {deep}, 50,000-span batch -> {huge}"
    )
    holds = (
        s_5xx == g_5xx == s_tb == g_tb == 0
        and integrity == "ok"
        and consistent
        and all(400 <= c < 500 for c in (oversized, deep, g_big))
        and huge < 500
    )
    return "R3", "schemathesis fuzzing of both OpenAPI documents", figures, holds


# -- R4 -------------------------------------------------------------------------------------------


async def _r4_gateway() -> list[bool]:
    store = open_store("memory://")
    refused: list[bool] = []
    try:
        try:
            await Gateway(store, []).start("0.0.0.0")
            refused.append(False)
        except UserError:
            refused.append(True)
        tokened = Gateway(store, [], token="s3cret")
        open_gw = Gateway(store, [])
        await tokened.start()
        await open_gw.start()
        async with httpx.AsyncClient(timeout=10) as http:
            for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "s3cret"}):
                answer = await http.get(f"{tokened.url}/gateway/stats", headers=headers)
                refused.append(answer.status_code == 401)
            body = b'{"upstreams": [{"base_url": "http://evil.example/v1"}]}'
            for headers in (
                {"host": "evil.example"},  # DNS rebinding: the page's own name
                {"content-type": "text/plain"},  # a cross-site form post
                {"content-type": "application/x-www-form-urlencoded"},
            ):
                answer = await http.post(f"{open_gw.url}/gateway/upstreams", content=body, headers=headers)
                refused.append(answer.status_code in (415, 421))
        await tokened.stop()
        await open_gw.stop()
    finally:
        await store.close()
    return refused


def _r4_store() -> list[bool]:
    refused: list[bool] = []
    try:
        ServerThread(open_store("memory://"), host="0.0.0.0")
        refused.append(False)
    except UserError:
        refused.append(True)
    with ServerThread(open_store("memory://"), close_store=True, token="s3cret") as tokened:
        for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "Basic s3cret"}):
            refused.append(httpx.get(f"{tokened.url}/v1/rollouts", headers=headers).status_code == 401)
    with ServerThread(open_store("memory://"), close_store=True) as open_server:
        answer = httpx.get(f"{open_server.url}/v1/rollouts", headers={"host": "evil.example"})
        refused.append(answer.status_code == 421)
        answer = httpx.post(
            f"{open_server.url}/v1/rollouts", content=b'{"specs": []}', headers={"content-type": "text/plain"}
        )
        refused.append(answer.status_code == 415)
    return refused


def r4_hijack() -> Row:
    results = asyncio.run(_r4_gateway()) + _r4_store()
    figures = f"{sum(results)} of {len(results)} attempts refused (non-loopback bind, tokens, rebinding, cross-site)"
    return "R4", "binding, tokens, cross-site and rebinding", figures, all(results)


# -- R5 -------------------------------------------------------------------------------------------


async def _r5_mode(mode: str, timeout_s: float) -> tuple[int, int, float, bool]:
    """(attempts, of them infrastructure, slowest attempt s, succeeded) for one broken upstream."""
    store = open_store("memory://")
    upstream = GarbageUpstream()
    await upstream.start()
    target = f"http://127.0.0.1:{_free_port()}/v1" if mode == "down" else upstream.base_url
    upstream.mode = mode
    gw = Gateway(store, [target], request_timeout_s=timeout_s)
    await gw.start()
    try:
        await store.add_resources(t.Resources(llm=t.LLMEndpoint(base_url=gw.url + "/v1", model="m")))
        await store.enqueue([t.RolloutSpec(rollout_id="r5", max_attempts=3)])
        agent = agents.streams_llm if mode in ("reset", "no_done") else agents.calls_llm
        runner = Runner(agent, store, config=RunnerConfig(exit_when_idle_s=0.3, adapters=[]))
        await asyncio.wait_for(runner.run(), 60)
        (rollout,) = await store.get_rollouts(["r5"])
        attempts = await store.get_attempts("r5")
        infra = sum(a.error is not None and a.error.kind is t.ErrorKind.INFRASTRUCTURE for a in attempts)
        slowest = max((a.ended_at or 0) - a.started_at for a in attempts)
        return len(attempts), infra, slowest, rollout.status is t.RolloutStatus.SUCCEEDED
    finally:
        await gw.stop()
        await upstream.stop()
        await store.close()


def r5_upstreams(timeout_s: float = 1.0) -> Row:
    modes = ["down", "slow", "status_500", "not_json", "wrong_shape", "reset_body", "reset", "no_done"]
    parts, holds = [], True
    for mode in modes:
        attempts, infra, slowest, succeeded = asyncio.run(_r5_mode(mode, timeout_s))
        parts.append(f"{mode}: {infra}/{attempts} infra, {slowest:.1f} s")
        holds = holds and attempts == 3 and infra == 3 and not succeeded and slowest < timeout_s + 5
    figures = "; ".join(parts) + f" (timeout {timeout_s:g} s; reset and no_done streamed; 3 attempts each)"
    return "R5", "broken upstreams", figures, holds


# -- R6 -------------------------------------------------------------------------------------------


async def _r6_in_process(
    agent: Callable[..., Any], task: object, timeout_s: float, upstream_url: str | None
) -> tuple[str, float, bool]:
    """(outcome, seconds, the next rollout succeeded) for one agent on an in-process runner."""
    store = open_store("memory://")
    gw = Gateway(store, [upstream_url] if upstream_url else [], served_model="fake-model")
    await gw.start()
    try:
        await store.add_resources(t.Resources(llm=t.LLMEndpoint(base_url=gw.url + "/v1", model="fake-model")))
        await store.enqueue([t.RolloutSpec(rollout_id="bad", input=task, timeout_s=timeout_s)])
        config = RunnerConfig(concurrency=1, cancel_grace_s=0.3, adapters=[], lease_s=1.0)

        # The same runner then runs a good rollout ("next"): training continues after a bad agent.
        if asyncio.iscoroutinefunction(agent):

            async def dispatch(task_: object, resources: t.Resources) -> Any:
                return 1.0 if task_ == "next" else await agent(task_, resources)

        else:

            def dispatch(task_: object, resources: t.Resources) -> Any:  # type: ignore[misc]
                return 1.0 if task_ == "next" else agent(task_, resources)

        runner = Runner(dispatch, store, config=config)
        stop = asyncio.Event()
        running = asyncio.ensure_future(runner.run(stop))
        started = time.monotonic()
        (bad,) = await store.wait_for_rollouts(["bad"], timeout=timeout_s + 30)
        seconds = time.monotonic() - started
        await store.enqueue([t.RolloutSpec(rollout_id="next", input="next", timeout_s=timeout_s)])
        (following,) = await store.wait_for_rollouts(["next"], timeout=timeout_s + 30)
        stop.set()
        await asyncio.wait_for(running, 30)
        outcome = bad.status.value
        if bad.error is not None:
            outcome += f" ({bad.error.kind.value}: {bad.error.type})"
        elif bad.final_reward is not None:
            outcome += f" (reward {bad.final_reward:g})"
        next_ok = following.status is t.RolloutStatus.SUCCEEDED
        return outcome, seconds, next_ok
    finally:
        await gw.stop()
        await store.close()


def _r6_process_death(workdir: Path) -> tuple[str, float]:
    url = f"sqlite:///{workdir}/r6.db"
    marker = workdir / "r6-killed"

    async def enqueue() -> None:
        store = open_store(url)
        await store.enqueue([t.RolloutSpec(rollout_id="dies", input=str(marker))])
        await store.close()

    asyncio.run(enqueue())
    config = RunnerConfig(adapters=[], lease_s=1.0, drain_timeout_s=5)
    pool = RunnerPool("reliability_agents:dies_once", url, processes=1, config=config, max_restarts=3)
    started = time.monotonic()
    pool.start()  # no wait_ready: the process may die in its first rollout before a slow machine reports ready

    async def final() -> tuple[t.Rollout, float]:
        store = open_store(url)
        try:
            while True:
                (rollout,) = await store.get_rollouts(["dies"])
                if rollout.status.is_final or time.monotonic() - started > 300:
                    return rollout, time.monotonic() - started
                pool.watch()
                await asyncio.sleep(0.2)
        finally:
            await store.close()

    rollout, seconds = asyncio.run(final())
    pool.stop(timeout=20)
    return f"{rollout.status.value} after {pool.restarts} replacement", seconds


def r6_agents(workdir: Path) -> Row:
    from agentbolt.testing.fake_llm import FakeLLMServer

    async def with_llm() -> list[tuple[str, str, float, bool]]:
        out = []
        async with FakeLLMServer() as llm:
            cases: list[tuple[str, Callable[..., Any], object]] = [
                ("raises", agents.raises, None),
                ("hangs (sync)", agents.hangs_sync, None),
                ("blocks its loop", agents.blocks_loop, None),
                ("returns a string", agents.returns, "a string"),
                ("returns NaN", agents.returns, "nan"),
                ("returns None", agents.returns, None),
                ("returns 1e308", agents.returns, 1e308),
                ("returns True", agents.returns, True),
                ("returns 10**400", agents.returns, "huge_int"),
                ("never calls the LLM", agents.no_llm, None),
                ("calls a wrong model", agents.calls_llm, "no-such-model"),
            ]
            for name, agent, task in cases:
                outcome, seconds, next_ok = await _r6_in_process(agent, task, 1.0, llm.base_url)
                out.append((name, outcome, seconds, next_ok))
        return out

    results = asyncio.run(with_llm())
    death, death_s = _r6_process_death(workdir)
    parts = [f"{name}: {outcome} in {seconds:.1f} s" for name, outcome, seconds, _ in results]
    parts.append(f"kills its runner process: {death} in {death_s:.1f} s")
    holds = all(next_ok and seconds < 1.0 + 5 for _, _, seconds, next_ok in results) and death.startswith("succeeded")
    expected_failures = {"raises", "hangs (sync)", "blocks its loop", "returns a string", "returns NaN"}
    expected_failures |= {"returns 10**400", "returns 1e308", "returns True"}  # rewards are finite numbers <= 1e15
    for name, outcome, _, _ in results:
        holds = holds and (outcome.startswith("failed") == (name in expected_failures))
    return "R6", "broken agents (timeout 1 s)", "; ".join(parts), holds


# -- main -----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small versions of every row")
    parser.add_argument("--rows", default="R1,R2,R3,R4,R5,R6", help="comma-separated rows to run")
    parser.add_argument("--rollouts", type=int, default=None, help="R1 rollouts (default 1000, quick 100)")
    parser.add_argument("--examples", type=int, default=None, help="R3 examples per operation (default 50, quick 5)")
    args = parser.parse_args(argv)
    rows = {r.strip().upper() for r in args.rows.split(",")}
    n = args.rollouts or (100 if args.quick else 1000)
    results: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="agentbolt-reliability-") as tmp:
        workdir = Path(tmp)
        steps: list[tuple[str, Callable[[], Row]]] = [
            ("R1", lambda: r1_runner_kills(n, workdir)),
            ("R2", lambda: r2_server_kills(workdir, 1.0 if args.quick else 3.0, postgres=not args.quick)),
            ("R3", lambda: r3_fuzz(workdir, args.examples or (5 if args.quick else 50))),
            ("R4", r4_hijack),
            ("R5", r5_upstreams),
            ("R6", lambda: r6_agents(workdir)),
        ]
        for row, step in steps:
            if row in rows:
                started = time.monotonic()
                result = step()
                results.append(result)
                print(f"{row} done in {time.monotonic() - started:.1f} s", file=sys.stderr, flush=True)
    print("| row | scenario | figures | holds |")
    print("|---|---|---|---|")
    for row, scenario, figures, holds in results:
        print(f"| {row} | {scenario} | {figures} | {'yes' if holds else 'NO'} |")
    return 0 if all(r[3] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
