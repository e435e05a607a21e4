"""agentbolt serve under simulated users: the held-out metric over wall-clock as versions go live,
gateway latency (steady, during an update, during a swap), requests failed, feedback lost.

Run:  uv run python benchmarks/online.py --policy smollm2 --seconds 1500 --json record.json --plot curve.png
      uv run python benchmarks/online.py [--seconds 20]                      # scripted: serving figures only
      uv run python benchmarks/online.py --report record.json [--plot curve.png]   # from a record

Two policies behind the same real server (gateway, SQLite store, sessions, feedback API, scripted
judge over HTTP, LightningRL, gate, swap with drain):

- ``--policy smollm2`` (or ``tiny``): :class:`agentbolt_torch.training.online.TorchOnlinePolicy`, full
  fine-tuning at the quickstart's learning rate. Each simulated session is the quickstart agent
  (``examples/quickstart``: its few-shot prompt, its calculator tool, up to three calls) asking one
  question from a fixed pool of ``--pool`` training questions (task key = the question), sampled at
  temperature 1. ``--rated`` of the sessions get the quickstart's reward as client feedback after
  a random delay (0-``--max-delay`` s); the rest are scored by a scripted judge (over HTTP, as an
  LLM judge) that reads the transcript and applies the same rule. Sessions are grouped ``auto``
  (a question asked by two or more sessions of an update is a GRPO group, the rest share the
  batch's baseline). The gate runs the same agent greedily on ``--val`` held-out questions — the
  quickstart's held-out split, which shares no problem with the pool — so the **held-out curve is
  the live version's gate score** over wall-clock. Latency here is the whole call (SmolLM2
  generating on the same two cores the update trains on): how much slower users are served while
  an update and the gate run, and during a swap.
- ``--policy scripted`` (default): a ScriptedPolicy (fixed reply functions behind two fake
  OpenAI-compatible servers, ``--latency`` s per answer; an update sleeps ``--train-seconds``).
  There is **no learning curve** (a scripted policy's held-out score would be a scripted result);
  the same requests sent directly to a fake upstream with the same latency give the latency the
  gateway **adds**.

Counted in both: requests failed (goal 0), feedback acknowledged but not in the store (goal 0),
sessions judged and judge answers malformed, updates, versions live, gate rejections.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai

from agentbolt import semconv
from agentbolt.online import GateOptions, JudgeOptions, OnlineServer, SessionOptions, UpdateOptions
from agentbolt.rewards import LLMJudge
from agentbolt.store import RolloutSearch
from agentbolt.testing.fake_llm import FakeLLM, FakeLLMServer, FakeRequest
from agentbolt.testing.scripted_judge import RubricRequest, ScriptedJudge
from agentbolt.testing.scripted_policy import ScriptedPolicy
from agentbolt.types import LLMEndpoint, Resources

REPO = Path(__file__).resolve().parents[1]
TOKEN = "bench"
SCRIPTED_POOL = [(f"What is {a} + {b}?", str(a + b)) for a, b in [(2, 3), (4, 4), (7, 5), (9, 6), (12, 7), (3, 8)]]
SCRIPTED_HELD_OUT = [
    {"question": f"What is {a} + {b}?", "answer": str(a + b)} for a, b in [(1, 1), (5, 6), (8, 9), (10, 3)]
]
_QUESTION = re.compile(r"\[user\] What is (\d+) ([+-]) (\d+)\?")


def _scripted_answer(request: FakeRequest) -> str:
    text = request.text
    try:
        a, b = text.removeprefix("What is ").removesuffix("?").split(" + ")
        return f"The answer is {int(a) + int(b)}."
    except ValueError:
        return "I do not know."


class TimedPolicy(ScriptedPolicy):
    """A ScriptedPolicy whose update takes time, as a real one occupies a thread."""

    def __init__(self, train_s: float, latency_s: float) -> None:
        super().__init__({"v": _scripted_answer}, initial="v", updates=["v"], latency_s=latency_s)
        self.train_s = train_s

    def train(self, rows: Any) -> dict[str, float]:
        time.sleep(self.train_s)
        return super().train(rows)


class SwapWatch:
    """Forwards to an online policy and says when a swap is under way (promote until release)."""

    def __init__(self, policy: Any) -> None:
        self._policy = policy
        self.swapping = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._policy, name)

    def promote(self) -> Any:
        self.swapping = True
        return self._policy.promote()

    def release(self, timeout_s: float) -> None:
        try:
            self._policy.release(timeout_s)
        finally:
            self.swapping = False


@dataclass
class Traffic:
    """What the simulated users saw."""

    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    failed: list[str] = field(default_factory=list)
    feedback_sent: set[str] = field(default_factory=set)
    feedback_acked: set[str] = field(default_factory=set)
    rewards: list[float] = field(default_factory=list)


@dataclass
class Scenario:
    """One policy's setup: the policy, its gate, the judge's rule and what one session does."""

    name: str
    policy: Any
    gate: GateOptions
    rubric: Callable[[RubricRequest], float]
    pool: list[Any]
    session: Callable[[Any, openai.AsyncOpenAI, openai.AsyncOpenAI, Traffic], Awaitable[float]]
    """``session(task, live, direct, traffic) -> reward``: one user session through ``live`` (its calls
    are timed by the client's event hooks; ``direct``: the fake upstream, the scripted baseline)."""
    grouping: str = "task_key"
    model: str = "m"


def scripted_scenario(args: argparse.Namespace) -> Scenario:
    async def held_out_agent(task: dict[str, Any], resources: Any) -> float:
        async with openai.AsyncOpenAI(base_url=resources.llm.base_url, api_key="x", max_retries=0) as client:
            reply = await client.chat.completions.create(
                model=resources.llm.model, messages=[{"role": "user", "content": task["question"]}]
            )
        return 1.0 if task["answer"] in (reply.choices[0].message.content or "") else 0.0

    async def session(task: Any, live: openai.AsyncOpenAI, direct: openai.AsyncOpenAI, traffic: Traffic) -> float:
        question, expected = task
        ok = True
        for _ in range(random.randint(1, 3)):
            messages = [{"role": "user", "content": question}]
            started = time.perf_counter()
            await direct.chat.completions.create(model="m", messages=messages)
            traffic.latencies["direct"].append(time.perf_counter() - started)
            reply = await live.chat.completions.create(model="m", messages=messages)
            ok = ok and expected in (reply.choices[0].message.content or "")
        return (1.0 if ok else 0.0) - random.random() * 0.2

    return Scenario(
        name="ScriptedPolicy (no learning; see the module docstring)",
        policy=TimedPolicy(args.train_seconds, args.latency),
        gate=GateOptions(agent=held_out_agent, tasks=SCRIPTED_HELD_OUT),
        rubric=lambda req: 9 if "answer is" in req.transcript else 2,
        pool=SCRIPTED_POOL,
        session=session,
    )


def quickstart_rubric(transcript: str) -> float:
    """The scripted judge's score of a quickstart session: the quickstart's reward (x10, a rubric
    score is 0-10) of the first ``<answer>`` after the last question asked in the transcript."""
    if str(REPO / "examples" / "quickstart") not in sys.path:
        sys.path.insert(0, str(REPO / "examples" / "quickstart"))
    from math_tasks import ANSWER, reward

    asked = list(_QUESTION.finditer(transcript))
    if not asked:
        return 0.0
    a, op, b = asked[-1].groups()
    gold = int(a) + int(b) if op == "+" else int(a) - int(b)
    answer = ANSWER.search(transcript[asked[-1].end() :])
    return 0.0 if answer is None else 10.0 * reward(answer.group(0), gold)


def torch_scenario(args: argparse.Namespace) -> Scenario:
    sys.path.insert(0, str(REPO / "examples" / "quickstart"))
    from agent import math_agent
    from math_tasks import make_tasks

    from agentbolt_torch.training.online import TorchOnlinePolicy
    from agentbolt_torch.update.updater import UpdateConfig

    policy = TorchOnlinePolicy(
        args.policy, update=UpdateConfig(lr=args.lr, seed=args.seed), engine={"default_max_tokens": args.max_tokens}
    )

    async def session(task: Any, live: openai.AsyncOpenAI, direct: openai.AsyncOpenAI, traffic: Traffic) -> float:
        return await math_agent(
            task, Resources(llm=LLMEndpoint(base_url=str(live.base_url), model=policy.model)), client=live
        )

    return Scenario(
        name=f"TorchOnlinePolicy({args.policy!r}), full fine-tuning, lr {args.lr:g}",
        policy=policy,
        gate=GateOptions(agent=math_agent, tasks=make_tasks(args.val, args.seed + 1, "h", heldout=True), timeout_s=900),
        rubric=lambda request: quickstart_rubric(request.transcript),
        pool=make_tasks(args.pool, args.seed, "p", heldout=False),
        session=session,
        grouping="auto",
        model=policy.model,
    )


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _task_key(task: Any) -> str:
    return task["question"] if isinstance(task, dict) else task[0]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    random.seed(args.seed)
    scenario = scripted_scenario(args) if args.policy == "scripted" else torch_scenario(args)
    policy = SwapWatch(scenario.policy)
    work = Path(tempfile.mkdtemp(prefix="agentbolt-online-bench-"))
    judge_script = ScriptedJudge(rubric=scenario.rubric)
    traffic = Traffic()
    timeline: list[dict[str, Any]] = []
    pending: list[asyncio.Task[None]] = []
    async with (
        FakeLLMServer(judge_script.fake_llm()) as judge_server,
        FakeLLMServer(FakeLLM(default_reply=_scripted_answer, latency_s=args.latency)) as direct,
    ):
        server = OnlineServer(
            f"sqlite:///{work / 'serve.db'}",
            policy,
            state_dir=work / "state",
            token=TOKEN,
            sessions=SessionOptions(idle_s=30),
            updates=UpdateOptions(min_sessions=args.min_sessions, grouping=scenario.grouping, check_every_s=0.5),
            gate=scenario.gate,
            judge=JudgeOptions(judge=LLMJudge(judge_server.base_url, "judge"), after_s=args.judge_after, every_s=0.5),
            metrics_every_s=2.0,
        )
        async with server:
            http = httpx.AsyncClient(headers={"authorization": f"Bearer {TOKEN}"}, timeout=60)
            started = time.monotonic()

            async def watch() -> None:
                """The live version's held-out score whenever it changes (the learning curve)."""
                seen: tuple[int, float] | None = None
                while True:
                    score = server.live_score
                    if score is not None and (score.version, score.mean) != seen:
                        seen = (score.version, score.mean)
                        timeline.append(
                            {
                                "t_s": time.monotonic() - started,
                                "version": score.version,
                                "mean": score.mean,
                                "se": score.se,
                            }
                        )
                    await asyncio.sleep(1.0)

            async def give_feedback(session: str, reward: float, delay: float) -> None:
                await asyncio.sleep(delay)
                fid = f"fb-{session}"
                traffic.feedback_sent.add(fid)
                for _ in range(5):  # a client retries on a transport error or a 5xx (idempotent)
                    try:
                        answer = await http.post(
                            f"{server.gateway.url}/v1/feedback",
                            json={"feedback_id": fid, "session_id": session, "reward": reward},
                        )
                    except httpx.HTTPError:
                        continue
                    if answer.status_code == 200:
                        traffic.feedback_acked.add(fid)
                        return
                    if answer.status_code < 500:
                        traffic.failed.append(f"feedback {fid}: {answer.status_code} {answer.text[:200]}")
                        return

            def phase() -> str:
                assert server.trainer is not None
                return "swap" if policy.swapping else "training" if server.trainer.busy else "steady"

            async def user(index: int, deadline: float) -> None:
                began: dict[int, tuple[str, float]] = {}

                async def on_request(request: httpx.Request) -> None:
                    began[id(request)] = (phase(), time.perf_counter())

                async def on_response(response: httpx.Response) -> None:
                    at, start = began.pop(id(response.request))
                    at = "swap" if policy.swapping else at  # a call a swap overlapped counts as the swap's
                    traffic.latencies[at].append(time.perf_counter() - start)

                hooks = {"request": [on_request], "response": [on_response]}
                async with (
                    openai.AsyncOpenAI(base_url=direct.base_url, api_key="x", max_retries=0) as baseline,
                    openai.AsyncOpenAI(
                        base_url=server.url,
                        api_key=TOKEN,
                        max_retries=0,
                        http_client=httpx.AsyncClient(event_hooks=hooks, timeout=900),
                    ) as live,
                ):
                    number = 0
                    while time.monotonic() < deadline:
                        number += 1
                        session = f"u{index}-{number}"
                        task = rng.choice(scenario.pool)
                        headers = {"X-Agentbolt-Session-Id": session, "X-Agentbolt-Task-Key": _task_key(task)}
                        try:
                            reward = await scenario.session(
                                task, live.with_options(default_headers=headers), baseline, traffic
                            )
                        except openai.APIError as exc:
                            traffic.failed.append(f"{session}: {exc}")
                            continue
                        traffic.rewards.append(reward)
                        await http.post(f"{server.gateway.url}/v1/sessions/close", json={"session_id": session})
                        if rng.random() < args.rated:
                            pending.append(
                                asyncio.create_task(give_feedback(session, reward, rng.random() * args.max_delay))
                            )

            watcher = asyncio.create_task(watch())
            await asyncio.gather(*(user(i, started + args.seconds) for i in range(args.users)))
            await asyncio.gather(*pending)
            await asyncio.sleep(args.judge_after + 1.5)  # the judge's last sweep
            while server.trainer is not None and server.trainer.busy:  # noqa: ASYNC110 - no event to wait on
                await asyncio.sleep(0.5)
            await asyncio.sleep(1.5)
            watcher.cancel()
            await server.gateway.flush()
            ids: list[str] = []
            for offset in range(0, 10**6, 1000):
                page = await server.store.search_rollouts(
                    RolloutSearch(run_id=server.run_id, limit=1000, offset=offset)
                )
                ids += [r.rollout_id for r in page.items if "agentbolt.session.id" in r.metadata]
                if len(page.items) < 1000:
                    break
            stored: set[str] = set()
            for i in range(0, len(ids), 200):
                for items in (await server.store.query_spans(ids[i : i + 200])).values():
                    stored |= {
                        str(s.attributes[semconv.FEEDBACK_ID])
                        for s in items
                        if s.attributes.get(semconv.FEEDBACK_SOURCE) == "client"
                    }
            status = server.status()
            decisions = list(server.decisions)
            swaps = list(server.swaps)
            await http.aclose()
    return _record(
        args, scenario, traffic, timeline, decisions, swaps, status, len(ids), stored, time.monotonic() - started
    )


def _record(
    args: argparse.Namespace,
    scenario: Scenario,
    traffic: Traffic,
    timeline: list[dict[str, Any]],
    decisions: list[dict[str, Any]],
    swaps: list[dict[str, Any]],
    status: dict[str, Any],
    sessions: int,
    stored_feedback: set[str],
    wall_s: float,
) -> dict[str, Any]:
    direct = traffic.latencies.get("direct", [])
    phases = {}
    for phase in ("steady", "training", "swap"):
        values = traffic.latencies[phase]
        row = {"calls": len(values), "p50_ms": 1000 * _pct(values, 0.5), "p99_ms": 1000 * _pct(values, 0.99)}
        if direct:
            row["added_p50_ms"] = row["p50_ms"] - 1000 * _pct(direct, 0.5)
            row["added_p99_ms"] = row["p99_ms"] - 1000 * _pct(direct, 0.99)
        phases[phase] = row
    return {
        "policy": args.policy,
        "model": scenario.name,
        "seconds": args.seconds,
        "wall_s": wall_s,
        "users": args.users,
        "min_sessions": args.min_sessions,
        "rated": args.rated,
        "sessions": sessions,
        "session_reward_mean": statistics.fmean(traffic.rewards) if traffic.rewards else None,
        "calls": sum(len(v) for k, v in traffic.latencies.items() if k != "direct"),
        "direct": {"calls": len(direct), "p50_ms": 1000 * _pct(direct, 0.5), "p99_ms": 1000 * _pct(direct, 0.99)}
        if direct
        else None,
        "phases": phases,
        "requests_failed": len(traffic.failed),
        "failures": traffic.failed[:10],
        "feedback_sent": len(traffic.feedback_sent),
        "feedback_acknowledged": len(traffic.feedback_acked),
        "feedback_lost": len(traffic.feedback_acked - stored_feedback),
        "judged": int(status["metrics"].get("online/judged", 0)),
        "judge_malformed": int(status["metrics"].get("judge/malformed", 0)),
        "held_out_overlap": int(status["metrics"].get("online/held_out_overlap", 0)),
        "updates": len(decisions),
        "versions_live": [s["version"] for s in swaps],
        "gate_rejected": sum(1 for d in decisions if not d["passed"]),
        "mean_swap_s": statistics.fmean(s["drain_s"] for s in swaps) if swaps else None,
        "timeline": timeline,
        "decisions": [
            {
                "version": d["version"],
                "passed": d["passed"],
                "reason": d["reason"],
                "candidate": d["candidate"]["mean"] if d.get("candidate") else None,
                "live": d["live"]["mean"] if d.get("live") else None,
                "delta": d.get("delta"),
                "bound": d.get("bound"),
            }
            for d in decisions
        ],
    }


def report(record: dict[str, Any]) -> None:
    """Print a record's figures."""
    print(f"agentbolt serve, {record['users']} users for {record['seconds']:g} s, {record['model']}")
    print(
        f"sessions {record['sessions']}, calls {record['calls']}, requests failed {record['requests_failed']}"
        + (f", mean session reward {record['session_reward_mean']:.3f}" if record.get("session_reward_mean") else "")
    )
    direct = record.get("direct")
    print(f"{'phase':<10}{'calls':>7}{'p50 ms':>9}{'p99 ms':>9}{'added p50':>11}{'added p99':>11}")
    if direct:
        print(f"{'direct':<10}{direct['calls']:>7}{direct['p50_ms']:>9.1f}{direct['p99_ms']:>9.1f}")
    for phase, row in record["phases"].items():
        added = (
            f"{row['added_p50_ms']:>11.1f}{row['added_p99_ms']:>11.1f}"
            if "added_p50_ms" in row
            else f"{'-':>11}{'-':>11}"
        )
        print(f"{phase:<10}{row['calls']:>7}{row['p50_ms']:>9.1f}{row['p99_ms']:>9.1f}{added}")
    print(
        f"feedback sent {record['feedback_sent']}, acknowledged {record['feedback_acknowledged']}, "
        f"lost {record['feedback_lost']}; judged {record['judged']} (malformed {record['judge_malformed']}); "
        f"held-out overlaps left out {record.get('held_out_overlap', 0)}"
    )
    print(
        f"updates {record['updates']}, versions live {record['versions_live']}, gate rejected {record['gate_rejected']}"
    )
    for point in record.get("timeline", []):
        print(
            f"  t={point['t_s']:>7.0f} s  live version {point['version']:>3}  held-out {point['mean']:.3f} ± {point['se']:.3f}"
        )
    for d in record.get("decisions", []):
        scores = f"candidate {d['candidate']:.3f} vs live {d['live']:.3f}" if d["candidate"] is not None else ""
        print(f"  v{d['version']}: {'live' if d['passed'] else 'rejected'} {scores} ({d['reason']})")


def plot(record: dict[str, Any], path: Path) -> None:
    """The live version's held-out score over wall-clock, rejected candidates marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = record["timeline"]
    if not points:
        print("no held-out score in the record: nothing to plot")
        return
    xs = [p["t_s"] / 60 for p in points] + [record["wall_s"] / 60]
    ys = [p["mean"] for p in points] + [points[-1]["mean"]]
    se = [p["se"] for p in points] + [points[-1]["se"]]
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    ax.step(xs, ys, where="post", label="live version (gate score)")
    ax.fill_between(
        xs,
        [y - s for y, s in zip(ys, se, strict=True)],
        [y + s for y, s in zip(ys, se, strict=True)],
        step="post",
        alpha=0.2,
    )
    for p in points:
        ax.annotate(
            f"v{p['version']}", (p["t_s"] / 60, p["mean"]), textcoords="offset points", xytext=(2, 4), fontsize=7
        )
    ax.set_xlabel("wall-clock (min)")
    ax.set_ylabel("held-out score (greedy)")
    ax.set_title(f"agentbolt serve: {record['model']}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"curve: {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", default="scripted", choices=["scripted", "smollm2", "tiny"])
    parser.add_argument("--seconds", type=float, default=20.0, help="how long the users keep coming")
    parser.add_argument("--users", type=int, default=6, help="concurrent simulated users")
    parser.add_argument("--min-sessions", type=int, default=16, help="rewarded sessions per update")
    parser.add_argument("--rated", type=float, default=0.7, help="share of sessions the users rate")
    parser.add_argument("--max-delay", type=float, default=3.0, help="longest feedback delay (s)")
    parser.add_argument("--judge-after", type=float, default=1.0, help="seconds before an unrated session is judged")
    parser.add_argument("--latency", type=float, default=0.05, help="scripted: the model's seconds per answer")
    parser.add_argument(
        "--train-seconds", type=float, default=2.0, help="scripted: seconds one update occupies a thread"
    )
    parser.add_argument("--pool", type=int, default=16, help="torch: training questions the users ask")
    parser.add_argument("--val", type=int, default=48, help="torch: held-out questions the gate runs")
    parser.add_argument("--max-tokens", type=int, default=40, help="torch: tokens per reply")
    parser.add_argument("--lr", type=float, default=1e-5, help="torch: learning rate (the quickstart's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="write the record here")
    parser.add_argument("--plot", type=Path, help="draw the held-out curve here (PNG)")
    parser.add_argument("--report", type=Path, help="print (and --plot) a record; run nothing")
    args = parser.parse_args()
    record = json.loads(args.report.read_text()) if args.report else asyncio.run(run(args))
    if args.json and not args.report:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=2))
    report(record)
    if args.plot:
        plot(record, args.plot)


if __name__ == "__main__":
    main()
