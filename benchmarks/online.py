"""agentbolt serve under simulated users: added gateway latency (steady, during an update, during a
swap), requests failed, feedback lost, sessions judged, versions gone live.

Run:  uv run python benchmarks/online.py [--seconds 20] [--users 6] [--json out.json]

**What this measures and what it does not.** The served "model" is a ScriptedPolicy
(agentbolt.testing.scripted_policy: fixed reply functions behind two fake OpenAI-compatible
servers, ``--latency`` seconds per answer; an update sleeps ``--train-seconds`` on a worker thread
as a real one would occupy one). Everything else is real: the gateway, the SQLite store, the
sessions, the feedback API, the scripted judge over HTTP, LightningRL, the gate and the swap with
drain. So the serving figures (latency added by the gateway, failures, lost feedback) are real;
there is **no learning curve**: the held-out metric of a scripted policy would be a scripted
result. The SmolLM2 run the issue asks for needs this benchmark driving
``agentbolt_torch.online.TorchOnlinePolicy`` (built and tested on the tiny model; not yet run here).

Simulated users: ``--users`` concurrent clients; each session asks 1-3 questions from a fixed
pool of quickstart-style arithmetic questions (task key = the question); ``--rated`` of the
sessions get client feedback after a random delay (0-``--max-delay`` s), the rest are scored by
the scripted judge ``--judge-after`` seconds after they close. The same clients' requests sent
directly to a fake upstream with the same latency give the baseline the gateway adds to.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import openai

from agentbolt import semconv
from agentbolt.online import GateOptions, JudgeOptions, OnlineServer, SessionOptions, UpdateOptions
from agentbolt.rewards import LLMJudge
from agentbolt.store import RolloutSearch
from agentbolt.testing.fake_llm import FakeLLM, FakeLLMServer, FakeRequest
from agentbolt.testing.scripted_judge import ScriptedJudge
from agentbolt.testing.scripted_policy import ScriptedPolicy

TOKEN = "bench"
POOL = [(f"What is {a} + {b}?", str(a + b)) for a, b in [(2, 3), (4, 4), (7, 5), (9, 6), (12, 7), (3, 8)]]
HELD_OUT = [{"question": f"What is {a} + {b}?", "answer": str(a + b)} for a, b in [(1, 1), (5, 6), (8, 9), (10, 3)]]


def _answer(request: FakeRequest) -> str:
    text = request.text
    try:
        a, b = text.removeprefix("What is ").removesuffix("?").split(" + ")
        return f"The answer is {int(a) + int(b)}."
    except ValueError:
        return "I do not know."


class TimedPolicy(ScriptedPolicy):
    """A ScriptedPolicy whose update takes time and which says when a swap is under way."""

    def __init__(self, train_s: float, latency_s: float) -> None:
        super().__init__({"v": _answer}, initial="v", updates=["v"], latency_s=latency_s)
        self.train_s = train_s
        self.swapping = False

    def train(self, rows: Any) -> dict[str, float]:
        time.sleep(self.train_s)
        return super().train(rows)

    def promote(self) -> Any:
        self.swapping = True
        return super().promote()

    def release(self, timeout_s: float) -> None:
        super().release(timeout_s)
        self.swapping = False


async def held_out_agent(task: dict[str, Any], resources: Any) -> float:
    async with openai.AsyncOpenAI(base_url=resources.llm.base_url, api_key="x", max_retries=0) as client:
        reply = await client.chat.completions.create(
            model=resources.llm.model, messages=[{"role": "user", "content": task["question"]}]
        )
    return 1.0 if task["answer"] in (reply.choices[0].message.content or "") else 0.0


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="agentbolt-online-bench-"))
    policy = TimedPolicy(args.train_seconds, args.latency)
    judge_script = ScriptedJudge(rubric=lambda req: 9 if "answer is" in req.transcript else 2)
    latencies: dict[str, list[float]] = defaultdict(list)
    failed: list[str] = []
    feedback_sent: list[str] = []
    feedback_acked: list[str] = []
    pending: list[asyncio.Task[None]] = []
    async with (
        FakeLLMServer(judge_script.fake_llm()) as judge_server,
        FakeLLMServer(FakeLLM(default_reply=_answer, latency_s=args.latency)) as direct,
    ):
        server = OnlineServer(
            f"sqlite:///{work / 'serve.db'}",
            policy,
            state_dir=work / "state",
            token=TOKEN,
            sessions=SessionOptions(idle_s=30),
            updates=UpdateOptions(min_sessions=args.min_sessions, grouping="task_key", check_every_s=0.5),
            gate=GateOptions(agent=held_out_agent, tasks=HELD_OUT),
            judge=JudgeOptions(judge=LLMJudge(judge_server.base_url, "judge"), after_s=args.judge_after, every_s=0.5),
            metrics_every_s=2.0,
        )
        async with server:
            http = httpx.AsyncClient(headers={"authorization": f"Bearer {TOKEN}"}, timeout=60)

            async def give_feedback(session: str, reward: float, delay: float) -> None:
                await asyncio.sleep(delay)
                fid = f"fb-{session}"
                feedback_sent.append(fid)
                for _ in range(5):  # a client retries on a transport error or a 5xx (idempotent)
                    try:
                        answer = await http.post(
                            f"{server.gateway.url}/v1/feedback",
                            json={"feedback_id": fid, "session_id": session, "reward": reward},
                        )
                    except httpx.HTTPError:
                        continue
                    if answer.status_code == 200:
                        feedback_acked.append(fid)
                        return
                    if answer.status_code < 500:
                        failed.append(f"feedback {fid}: {answer.status_code} {answer.text[:200]}")
                        return

            async def user(index: int, deadline: float) -> None:
                number = 0
                async with (
                    openai.AsyncOpenAI(base_url=server.url, api_key=TOKEN, max_retries=0) as live,
                    openai.AsyncOpenAI(base_url=direct.base_url, api_key="x", max_retries=0) as baseline,
                ):
                    while time.monotonic() < deadline:
                        number += 1
                        session = f"u{index}-{number}"
                        question, expected = rng.choice(POOL)
                        headers = {"X-Agentbolt-Session-Id": session, "X-Agentbolt-Task-Key": question}
                        ok = True
                        for _ in range(rng.randint(1, 3)):
                            messages = [{"role": "user", "content": question}]
                            started = time.perf_counter()
                            await baseline.chat.completions.create(model="m", messages=messages)
                            latencies["direct"].append(time.perf_counter() - started)
                            assert server.trainer is not None
                            phase = "training" if server.trainer.busy else "steady"
                            phase = "swap" if policy.swapping else phase
                            started = time.perf_counter()
                            try:
                                reply = await live.chat.completions.create(
                                    model="m", messages=messages, extra_headers=headers
                                )
                            except openai.APIError as exc:
                                failed.append(f"{session}: {exc}")
                                ok = False
                                continue
                            phase = "swap" if policy.swapping else phase
                            latencies[phase].append(time.perf_counter() - started)
                            ok = ok and expected in (reply.choices[0].message.content or "")
                        await http.post(f"{server.gateway.url}/v1/sessions/close", json={"session_id": session})
                        if rng.random() < args.rated:
                            reward = (1.0 if ok else 0.0) - rng.random() * 0.2
                            pending.append(
                                asyncio.create_task(give_feedback(session, reward, rng.random() * args.max_delay))
                            )

            started = time.monotonic()
            await asyncio.gather(*(user(i, started + args.seconds) for i in range(args.users)))
            await asyncio.gather(*pending)
            await asyncio.sleep(args.judge_after + 1.5)  # the judge's last sweep
            while server.trainer is not None and server.trainer.busy:  # noqa: ASYNC110 - no event to wait on
                await asyncio.sleep(0.2)
            await server.gateway.flush()
            page = await server.store.search_rollouts(RolloutSearch(run_id=server.run_id, limit=1000))
            ids = [r.rollout_id for r in page.items if "agentbolt.session.id" in r.metadata]
            stored: set[str] = set()
            for i in range(0, len(ids), 200):
                for items in (await server.store.query_spans(ids[i : i + 200])).values():
                    stored |= {
                        str(s.attributes[semconv.FEEDBACK_ID])
                        for s in items
                        if s.attributes.get(semconv.FEEDBACK_SOURCE) == "client"
                    }
            status = server.status()
            await http.aclose()
    direct_p50, direct_p99 = _pct(latencies["direct"], 0.5), _pct(latencies["direct"], 0.99)
    phases = {}
    for phase in ("steady", "training", "swap"):
        values = latencies[phase]
        phases[phase] = {
            "calls": len(values),
            "p50_ms": 1000 * _pct(values, 0.5),
            "p99_ms": 1000 * _pct(values, 0.99),
            "added_p50_ms": 1000 * (_pct(values, 0.5) - direct_p50),
            "added_p99_ms": 1000 * (_pct(values, 0.99) - direct_p99),
        }
    return {
        "model": "ScriptedPolicy (no learning; see the module docstring)",
        "seconds": args.seconds,
        "users": args.users,
        "sessions": len(ids),
        "calls": sum(len(v) for k, v in latencies.items() if k != "direct"),
        "direct": {"calls": len(latencies["direct"]), "p50_ms": 1000 * direct_p50, "p99_ms": 1000 * direct_p99},
        "phases": phases,
        "requests_failed": len(failed),
        "failures": failed[:10],
        "feedback_sent": len(set(feedback_sent)),
        "feedback_acknowledged": len(set(feedback_acked)),
        "feedback_lost": len(set(feedback_acked) - stored),
        "judged": int(status["metrics"].get("online/judged", 0)),
        "judge_malformed": int(status["metrics"].get("judge/malformed", 0)),
        "updates": len(status["decisions"]),
        "versions_live": [s["version"] for s in status["swaps"]],
        "gate_rejected": sum(1 for d in status["decisions"] if not d["passed"]),
        "mean_swap_s": statistics.fmean(s["drain_s"] for s in status["swaps"]) if status["swaps"] else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="how long the users keep coming")
    parser.add_argument("--users", type=int, default=6, help="concurrent simulated users")
    parser.add_argument("--latency", type=float, default=0.05, help="the served model's seconds per answer")
    parser.add_argument("--train-seconds", type=float, default=2.0, help="seconds one update occupies a thread")
    parser.add_argument("--min-sessions", type=int, default=16, help="rewarded sessions per update")
    parser.add_argument("--rated", type=float, default=0.7, help="share of sessions the users rate")
    parser.add_argument("--max-delay", type=float, default=3.0, help="longest feedback delay (s)")
    parser.add_argument("--judge-after", type=float, default=1.0, help="seconds before an unrated session is judged")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="write the record here")
    args = parser.parse_args()
    record = asyncio.run(run(args))
    print(f"agentbolt serve, {record['users']} users for {record['seconds']:g} s, {record['model']}")
    print(f"sessions {record['sessions']}, calls {record['calls']}, requests failed {record['requests_failed']}")
    direct = record["direct"]
    print(f"{'phase':<10}{'calls':>7}{'p50 ms':>9}{'p99 ms':>9}{'added p50':>11}{'added p99':>11}")
    print(f"{'direct':<10}{direct['calls']:>7}{direct['p50_ms']:>9.1f}{direct['p99_ms']:>9.1f}{'':>11}{'':>11}")
    for phase, row in record["phases"].items():
        print(
            f"{phase:<10}{row['calls']:>7}{row['p50_ms']:>9.1f}{row['p99_ms']:>9.1f}"
            f"{row['added_p50_ms']:>11.1f}{row['added_p99_ms']:>11.1f}"
        )
    print(
        f"feedback sent {record['feedback_sent']}, acknowledged {record['feedback_acknowledged']}, "
        f"lost {record['feedback_lost']}; judged {record['judged']} (malformed {record['judge_malformed']})"
    )
    print(
        f"updates {record['updates']}, versions live {record['versions_live']}, gate rejected {record['gate_rejected']}"
    )
    if args.json:
        args.json.write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
