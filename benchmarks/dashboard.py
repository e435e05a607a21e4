"""Server time of the dashboard's pages on a big SQLite store (not run in CI).

Run:  uv run python benchmarks/dashboard.py [--rollouts 100000] [--spans-per-rollout 10] [--db PATH]

Fills a new SQLite store (the real schema, created by ``SqlStore``) with ``--rollouts``
finished rollouts in 10 runs (100 steps x groups of 4 each), one attempt each and
``--spans-per-rollout`` spans each (an agent span, two LLM calls with token ids and logprobs,
tools, operations, a reward: 1M spans at the defaults), with bulk ``executemany`` inserts. Then
serves the dashboard app in-process (ASGI, no network) and prints the median and worst time of
each page over ``--repeat`` requests, after one warm-up request: target <= 200 ms each.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import orjson

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.store import open_store
from agentbolt.store.sql import span_key
from agentbolt_dashboard import create_app

RUNS = 10
GROUP = 4


def _span_templates(spans_per_rollout: int) -> list[dict]:
    """One rollout's spans as dicts (ids replaced per rollout)."""
    rng = random.Random(0)
    base = 1_700_000_000_000_000_000
    prompt = [rng.randrange(50_000) for _ in range(120)]
    spans: list[dict] = []

    def add(name: str, parent: int | None, start_ms: float, end_ms: float, attrs: dict) -> int:
        spans.append(
            {
                "name": name,
                "parent": parent,
                "start": base + int(start_ms * 1e6),
                "end": base + int(end_ms * 1e6),
                "attributes": attrs,
            }
        )
        return len(spans) - 1

    root = add(
        "agent solver",
        None,
        0,
        900,
        {semconv.GEN_AI_OPERATION_NAME: "invoke_agent", semconv.GEN_AI_AGENT_NAME: "solver"},
    )
    for call in range(2):
        response = [rng.randrange(50_000) for _ in range(32)]
        add(
            semconv.SPAN_LLM_CALL,
            root,
            10 + call * 400,
            300 + call * 400,
            {
                semconv.SPAN_KIND_ATTR: semconv.KIND_LLM,
                semconv.GEN_AI_OPERATION_NAME: "chat",
                semconv.GEN_AI_INPUT_MESSAGES: orjson.dumps(
                    [{"role": "user", "content": "What is 12 + 30? Use the calculator."}]
                ).decode(),
                semconv.GEN_AI_OUTPUT_MESSAGES: orjson.dumps([{"role": "assistant", "content": "42"}]).decode(),
                semconv.TOKEN_SOURCE: semconv.TOKEN_SOURCE_EXACT,
                semconv.PROMPT_TOKEN_IDS: prompt + response[:10] * call,
                semconv.RESPONSE_TOKEN_IDS: response,
                semconv.RESPONSE_LOGPROBS: [round(-rng.random() * 3, 4) for _ in response],
                semconv.POLICY_VERSION: 1,
            },
        )
        add(
            "execute_tool calculator",
            root,
            310 + call * 400,
            330 + call * 400,
            {semconv.GEN_AI_OPERATION_NAME: "execute_tool", semconv.GEN_AI_TOOL_NAME: "calculator"},
        )
    while len(spans) < spans_per_rollout - 1:
        add(
            semconv.SPAN_OPERATION,
            root,
            850,
            860,
            {semconv.SPAN_KIND_ATTR: semconv.KIND_OPERATION, semconv.OPERATION_NAME: "check"},
        )
    add(
        semconv.SPAN_REWARD,
        root,
        880,
        880,
        {semconv.SPAN_KIND_ATTR: semconv.KIND_REWARD, semconv.REWARD_VALUE: 1.0, semconv.REWARD_IS_FINAL: True},
    )
    return spans[:spans_per_rollout]


def fill(db: Path, n_rollouts: int, spans_per_rollout: int) -> tuple[str, str]:
    """Write the store; returns (a run id, a rollout id in the middle)."""
    asyncio.run(open_store(f"sqlite:///{db}").close())  # the real schema
    templates = _span_templates(spans_per_rollout)
    rng = random.Random(1)
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA synchronous = OFF")
    now = time.time() - 86_400
    per_run = n_rollouts // RUNS
    run_ids = [f"run-bench{r:02d}" for r in range(RUNS)]
    with conn:
        conn.executemany(
            "INSERT INTO runs (id, run_id, name, algorithm, model, config, status, started_at, ended_at, steps, latest) "
            "VALUES (?, ?, ?, 'torch-grpo', 'smollm2', '{}', 'succeeded', ?, ?, ?, ?)",
            [
                (
                    r + 1,
                    rid,
                    f"bench-{r}",
                    now,
                    now + 3600,
                    per_run // (GROUP * 25),
                    orjson.dumps({"train/reward": 0.5}).decode(),
                )
                for r, rid in enumerate(run_ids)
            ],
        )
        conn.executemany(
            "INSERT INTO run_metrics (run_key, step, time, run_values) VALUES (?, ?, ?, ?)",
            [
                (r + 1, s, now + s, orjson.dumps({"train/reward": rng.random(), "update/loss": rng.random()}).decode())
                for r in range(RUNS)
                for s in range(1, per_run // (GROUP * 25) + 1)
            ],
        )
    key = 0
    span_row = 0
    middle = ""
    started = time.monotonic()
    for r, run_id in enumerate(run_ids):
        rollouts, attempts, spans = [], [], []
        for i in range(per_run):
            key += 1
            step = i // (GROUP * 25) + 1
            group = f"{run_id}:step{step}:task-{(i // GROUP) % 25}"
            rid = f"{group}:{i % GROUP}"
            aid = f"at-{key:012x}"
            reward = rng.choice((0.0, 0.5, 1.0))
            failed = key % 50 == 0
            error = (
                t.ErrorInfo(kind=t.ErrorKind.AGENT, type="ValueError", message="bad answer").model_dump_json()
                if failed
                else None
            )
            ts = now + key * 0.01
            rollouts.append(
                (key, rid, f"task-{(i // GROUP) % 25}", orjson.dumps({"question": f"What is {i} + 30?"}).decode(),
                 "train", group, 1, "failed" if failed else "succeeded", 1, 3, None, None if failed else reward, error,
                 aid, ts, ts, ts + 1, ts + 1, "{}", spans_per_rollout, run_id, step)
            )  # fmt: skip
            attempts.append(
                (aid, rid, 1, f"runner-{key % 8}", "failed" if failed else "succeeded", ts, ts, ts + 1, error)
            )
            trace = f"{key:032x}"
            ids = [f"{(key << 8) | j:016x}" for j in range(len(templates))]
            for j, tpl in enumerate(templates):
                body = {
                    "trace_id": trace,
                    "span_id": ids[j],
                    "parent_span_id": None if tpl["parent"] is None else ids[tpl["parent"]],
                    "name": tpl["name"],
                    "kind": "INTERNAL",
                    "start_time_ns": tpl["start"] + key * 10**9,
                    "end_time_ns": tpl["end"] + key * 10**9,
                    "status": {"code": "UNSET", "message": ""},
                    "attributes": tpl["attributes"],
                    "schema_version": semconv.SCHEMA_VERSION,
                }
                span_row += 1
                spans.append((span_row, key, j + 1, span_key(ids[j]), aid, orjson.dumps(body).decode()))
            if r == RUNS // 2 and i == per_run // 2:
                middle = rid
        with conn:
            conn.executemany(
                f"INSERT INTO rollouts (id, rollout_id, task_id, input, mode, group_id, resources_version, status, "
                f"attempt_count, max_attempts, timeout_s, final_reward, error, current_attempt_id, created_at, "
                f"started_at, ended_at, updated_at, metadata, span_seq, run_id, step) VALUES ({', '.join('?' * 22)})",
                rollouts,
            )
            conn.executemany(
                "INSERT INTO attempts (attempt_id, rollout_id, idx, worker_id, status, started_at, heartbeat_at, "
                "ended_at, error) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                attempts,
            )
            conn.executemany(
                "INSERT INTO spans (id, rkey, seq, skey, attempt_id, body) VALUES (?, ?, ?, ?, ?, ?)", spans
            )
    conn.execute("ANALYZE")
    conn.close()
    print(
        f"filled {key} rollouts, {span_row} spans in {time.monotonic() - started:.1f} s ({db.stat().st_size / 2**20:.0f} MiB)"
    )
    return run_ids[RUNS // 2], middle


async def measure(db: Path, run_id: str, rollout_id: str, repeat: int) -> None:
    store = open_store(f"sqlite:///{db}", sweep_interval_s=0)
    app = create_app(store)
    pages = [
        ("runs page", "/runs"),
        ("rollouts page (run filter, page 100)", f"/rollouts?run={run_id}&page=100"),
        ("rollouts page (unfiltered, page 1)", "/rollouts"),
        ("rollouts page (run + step + reward range)", f"/rollouts?run={run_id}&step=50&reward_min=0.5"),
        ("rollouts page (task text search, all runs)", "/rollouts?q=task-7"),
        ("trajectory", f"/rollouts/{rollout_id}"),
        ("run page", f"/runs/{run_id}"),
        ("reward debugger (LightningRL on 400 rollouts)", f"/runs/{run_id}/rewards"),
        ("health", "/health"),
    ]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://dashboard") as client:
        for label, path in pages:
            assert (await client.get(path)).status_code == 200, path  # warm-up
            times = []
            for _ in range(repeat):
                started = time.perf_counter()
                response = await client.get(path)
                times.append((time.perf_counter() - started) * 1000)
                assert response.status_code == 200
            print(
                f"{label:46s} median {statistics.median(times):7.1f} ms   max {max(times):7.1f} ms   ({len(response.content) // 1024} KiB)"
            )
    await store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=100_000)
    parser.add_argument("--spans-per-rollout", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--db", type=Path, help="where to write the store (default: a temporary folder)")
    args = parser.parse_args()
    db = args.db or Path(tempfile.mkdtemp(prefix="agentbolt-dash-bench-")) / "store.db"
    db.parent.mkdir(parents=True, exist_ok=True)
    if db.exists():
        raise SystemExit(f"{db} exists; pass a new --db path")
    run_id, rollout_id = fill(db, args.rollouts, args.spans_per_rollout)
    asyncio.run(measure(db, run_id, rollout_id, args.repeat))


if __name__ == "__main__":
    main()
