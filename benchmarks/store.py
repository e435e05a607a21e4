"""Store throughput: rollout lifecycle and span ingest for memory, SQLite and PostgreSQL.

Run:  uv run python benchmarks/store.py [--rollouts 3000] [--spans 50000] [--no-postgres]

Prints, per backend:
- lifecycle: rollouts/s for enqueue (batches of 100) -> dequeue -> finish, with one worker
  claiming one rollout at a time, and with 8 concurrent workers claiming up to 8 each;
- span ingest: spans/s for batches of 100 spans (about 500 bytes of JSON each, from 20
  concurrently active rollouts of 100 spans), from one producer and from 4 concurrent ones;
- for SQLite, raw ``sqlite3.executemany`` of the same rows into the same table layout
  (same indexes, WAL, synchronous=NORMAL, a commit per batch) as the physical reference.

PostgreSQL runs on a throwaway local server (started as the ``postgres`` user when root).
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import sqlite3
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

from agentbolt import semconv
from agentbolt import types as t
from agentbolt.store import open_store
from agentbolt.testing.postgres import find_postgres_bindir, throwaway_postgres

BATCH = 100


def make_spans(n: int, rollout_ids: list[str], per_rollout: int = 100, active: int = 20) -> list[t.Span]:
    """Spans as a busy run produces them: ``active`` rollouts emitting in turn."""
    spans: list[t.Span] = []
    queue = list(rollout_ids)
    current = [[queue.pop(0), 0] for _ in range(active)]
    while len(spans) < n:
        for slot in current:
            rid, k = slot
            spans.append(
                t.Span.create(
                    "openai.chat.completions",
                    rollout_id=rid,
                    kind=t.SpanKind.CLIENT,
                    attributes={
                        semconv.GEN_AI_OPERATION_NAME: "chat",
                        semconv.GEN_AI_REQUEST_MODEL: "smollm2-135m",
                        semconv.GEN_AI_RESPONSE_ID: f"chatcmpl-{secrets.token_hex(6)}",
                        semconv.GEN_AI_USAGE_INPUT_TOKENS: 182,
                        semconv.GEN_AI_USAGE_OUTPUT_TOKENS: 41,
                        semconv.GEN_AI_RESPONSE_FINISH_REASONS: ["stop"],
                        semconv.POLICY_VERSION: 3,
                        semconv.TOKEN_SOURCE: "exact",
                        semconv.GEN_AI_AGENT_NAME: "solver",
                        "agentbolt.llm.turn": k,
                    },
                )
            )
            slot[1] += 1
            if slot[1] == per_rollout and queue:
                slot[0], slot[1] = queue.pop(0), 0
    return spans[:n]


async def lifecycle(url: str, n: int, workers: int, claim: int, store_options: dict | None = None) -> float:
    """Rollouts/s through enqueue, claim and finish with ``workers`` concurrent claimers."""
    store = open_store(url, **({"sweep_interval_s": 0} if store_options is None else store_options))
    try:
        start = time.perf_counter()
        tag = secrets.token_hex(4)
        for i in range(0, n, BATCH):
            await store.enqueue(
                [t.RolloutSpec(rollout_id=f"lc-{tag}-{j}", input={"q": j}) for j in range(i, min(n, i + BATCH))]
            )
        done = 0

        async def worker(w: int) -> None:
            nonlocal done
            while done < n:
                claims = await store.dequeue(f"w{w}", limit=claim)
                if not claims:
                    return
                for c in claims:
                    await store.finish_attempt(c.attempt.attempt_id, t.AttemptStatus.SUCCEEDED, reward=1.0)
                    done += 1

        await asyncio.gather(*(worker(w) for w in range(workers)))
        elapsed = time.perf_counter() - start
        assert done == n, (done, n)
        return n / elapsed
    finally:
        await store.close()


async def ingest(url: str, spans: list[t.Span], rollout_ids: list[str], producers: int) -> float:
    store = open_store(url, sweep_interval_s=0)
    try:
        for i in range(0, len(rollout_ids), BATCH):
            await store.enqueue([t.RolloutSpec(rollout_id=r) for r in rollout_ids[i : i + BATCH]])
        batches = [spans[i : i + BATCH] for i in range(0, len(spans), BATCH)]
        start = time.perf_counter()

        async def producer(k: int) -> None:
            for b in batches[k::producers]:
                await store.add_spans(b)

        await asyncio.gather(*(producer(k) for k in range(producers)))
        elapsed = time.perf_counter() - start
        counts = await store.query_spans(rollout_ids[:1])
        assert counts[rollout_ids[0]], "spans were not stored"
        return len(spans) / elapsed
    finally:
        await store.close()


def raw_sqlite(path: Path, spans: list[t.Span], *, commit_every: int) -> float:
    """Physical reference: the same rows into the same layout with sqlite3.executemany."""
    from agentbolt.store.sql import SqlStore, span_key

    asyncio.run(SqlStore(f"sqlite:///{path}", sweep_interval_s=0).close())  # creates the same tables
    rows = []
    seqs: dict[str, int] = {}
    keys: dict[str, int] = {}
    for s in spans:
        rid = s.rollout_id
        assert rid is not None
        keys.setdefault(rid, len(keys) + 1)
        seqs[rid] = seqs.get(rid, 0) + 1
        rows.append((keys[rid], seqs[rid], span_key(s.span_id), s.attempt_id, t.span_body_json(s)))
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    start = time.perf_counter()
    conn.execute("BEGIN")
    for k, i in enumerate(range(0, len(rows), BATCH)):
        conn.executemany(
            "INSERT INTO spans (rkey, seq, skey, attempt_id, body) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT (rkey, skey) DO NOTHING",
            rows[i : i + BATCH],
        )
        if (k + 1) % commit_every == 0:
            conn.execute("COMMIT")
            conn.execute("BEGIN")
    conn.execute("COMMIT")
    elapsed = time.perf_counter() - start
    conn.close()
    return len(rows) / elapsed


def best(fn: Callable[[], float], repeat: int) -> float:
    return max(fn() for _ in range(repeat))


def run_backend(name: str, url_for: Callable[[], str], args: argparse.Namespace, n_for_spans: int) -> dict[str, float]:
    rollout_ids = [f"sp-{secrets.token_hex(6)}" for _ in range(n_for_spans)]
    spans = make_spans(args.spans, rollout_ids)
    figures = {}
    for label, workers in (("lifecycle 1x1", 1), ("lifecycle 8x8", 8)):
        figures[label] = best(lambda w=workers: asyncio.run(lifecycle(url_for(), args.rollouts, w, w)), args.repeat)
    for label, producers in (("ingest 1 prod", 1), ("ingest 4 prod", 4)):
        figures[label] = best(lambda p=producers: asyncio.run(ingest(url_for(), spans, rollout_ids, p)), args.repeat)
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rollouts", type=int, default=3000)
    ap.add_argument("--spans", type=int, default=50_000)
    ap.add_argument("--repeat", type=int, default=3, help="runs per figure; the best is printed")
    ap.add_argument("--no-postgres", action="store_true")
    args = ap.parse_args()

    n_for_spans = args.spans // 100 + 20
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="agentbolt-bench-")))
        backends: dict[str, Callable[[], str]] = {"memory": lambda: "memory://"}
        backends["sqlite"] = lambda: f"sqlite:///{tmp / (secrets.token_hex(4) + '.db')}"
        if not args.no_postgres and find_postgres_bindir() is not None:
            pg = stack.enter_context(throwaway_postgres())
            backends["postgresql"] = lambda: f"{pg}?schema=b{secrets.token_hex(4)}"
        print(
            f"store benchmark: {args.rollouts} rollouts; {args.spans} spans in batches of {BATCH}; best of {args.repeat}"
        )
        columns = ("lifecycle 1x1", "lifecycle 8x8", "ingest 1 prod", "ingest 4 prod")
        print(f"{'backend':<12}" + "".join(f"{c:>18}" for c in columns))
        results = {}
        for name, url_for in backends.items():
            results[name] = run_backend(name, url_for, args, n_for_spans)
            units = ("ro/s", "ro/s", "spans/s", "spans/s")
            print(
                f"{name:<12}"
                + "".join(f"{results[name][c]:>{18 - len(u) - 1},.0f} {u}" for c, u in zip(columns, units, strict=True))
            )
        # The physical reference: the same rows into the same layout, no store in between.
        # Ours and raw alternate so that both see the same machine conditions.
        rollout_ids = [f"sp-{secrets.token_hex(6)}" for _ in range(n_for_spans)]
        spans = make_spans(args.spans, rollout_ids)
        ours, raw1, raw_all = [], [], []
        for _ in range(args.repeat):
            ours.append(asyncio.run(ingest(backends["sqlite"](), spans, rollout_ids, 1)))
            raw1.append(raw_sqlite(tmp / f"raw-{secrets.token_hex(3)}.db", spans, commit_every=1))
            raw_all.append(raw_sqlite(tmp / f"raw-{secrets.token_hex(3)}.db", spans, commit_every=10**9))
        print(
            f"raw sqlite3.executemany of the same rows: {max(raw1):,.0f} spans/s with a commit per batch, "
            f"{max(raw_all):,.0f} spans/s in one transaction"
        )
        ratios = sorted(o / r for o, r in zip(ours, raw1, strict=True))
        print(
            f"SQLite store ingest (1 producer, alternating runs): best {max(ours):,.0f} spans/s = "
            f"{100 * max(ours) / max(raw1):.0f}% of the best raw; per-pair ratio median {100 * ratios[len(ratios) // 2]:.0f}%"
        )


if __name__ == "__main__":
    main()
