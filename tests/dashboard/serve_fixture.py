"""A store filled by a real ``agentbolt serve`` session, for the Serving page's tests (imported by
name, like ``dashboard_helpers``).

The store, gateway, sessions, feedback API, judge sweep, LightningRL, gate and ledger are the real
ones; the "model" is a :class:`~agentbolt.testing.scripted_policy.ScriptedPolicy` (named reply
functions behind fake OpenAI-compatible servers) and the judge a
:class:`~agentbolt.testing.scripted_judge.ScriptedJudge`: they stand for the models.

What it leaves in the store (one serve run):

- ``user-0`` .. ``user-5``: closed sessions a client rated (reward ``i % 2``), one call each;
- update 1 trains on ``user-0..2`` and its candidate (version 2, weights ``worse``) is kept out
  by the gate; update 2 trains on ``user-3..5`` and its candidate (version 3) goes live;
- ``judged``: a closed session nobody rated, scored 0.8 by the judge;
- ``odd``: a closed session the judge answers with garbage (a parse failure, left unscored);
- ``open``: a session still open (no feedback yet).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai

from agentbolt import types as t
from agentbolt.online import GateOptions, JudgeOptions, OnlineServer, SessionOptions, UpdateOptions
from agentbolt.rewards import LLMJudge
from agentbolt.testing.fake_llm import FakeLLMServer, FakeRequest
from agentbolt.testing.scripted_judge import RubricRequest, ScriptedJudge
from agentbolt.testing.scripted_policy import ScriptedPolicy

TOKEN = "s3cret"
CAPITALS = {"France": "Paris", "Italy": "Rome", "Spain": "Madrid", "Japan": "Tokyo", "Peru": "Lima"}
HELD_OUT = [{"country": c, "answer": a} for c, a in list(CAPITALS.items())[:4]]
RATED = 6


@dataclass(frozen=True)
class ServeFacts:
    """What the serve process knew when it stopped (the page must show the same)."""

    url: str
    run_id: str
    live_version: int
    decisions: list[dict[str, Any]]
    """The ledger's gate decisions, oldest first."""
    judge_malformed: int
    judge_calls: int


def _right(request: FakeRequest) -> str:
    return next((f"{city}." for country, city in CAPITALS.items() if country in request.text), "I do not know.")


async def held_out_agent(task: dict[str, Any], resources: t.Resources) -> float:
    """The gate's agent: asks for a capital, 1 if the answer names it."""
    assert resources.llm is not None
    async with openai.AsyncOpenAI(base_url=resources.llm.base_url, api_key="x", max_retries=0) as client:
        answer = await client.chat.completions.create(
            model=resources.llm.model, messages=[{"role": "user", "content": f"Capital of {task['country']}?"}]
        )
    return 1.0 if task["answer"] in (answer.choices[0].message.content or "") else 0.0


def _judge_rubric(request: RubricRequest) -> float | str:
    return 8 if "Madrid" in request.transcript else "no idea, sorry"  # the second is malformed


async def _until(condition: Any, what: str, timeout_s: float = 60.0) -> None:
    for _ in range(int(timeout_s / 0.02)):
        if condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"not reached: {what}")


async def _ask(server: OnlineServer, session: str, question: str) -> None:
    client = openai.AsyncOpenAI(
        base_url=server.url, api_key=TOKEN, max_retries=0, default_headers={"X-Agentbolt-Session-Id": session}
    )
    async with client:
        await client.chat.completions.create(model="any", messages=[{"role": "user", "content": question}])


async def _rate(server: OnlineServer, session: str, reward: float, comment: str | None = None) -> None:
    body: dict[str, Any] = {"feedback_id": f"fb-{session}", "session_id": session, "reward": reward}
    if comment:
        body["comment"] = comment
    async with httpx.AsyncClient(headers={"authorization": f"Bearer {TOKEN}"}) as http:
        answer = await http.post(f"{server.gateway.url}/v1/feedback", json=body)
    assert answer.status_code == 200, answer.text


async def fill_serve_store(root: Path) -> ServeFacts:
    """Run the serve session described in the module docstring into ``sqlite:///{root}/serve.db``."""
    url = f"sqlite:///{root / 'serve.db'}"
    policy = ScriptedPolicy(
        {"base": _right, "same": _right, "worse": lambda req: "Lyon."}, initial="base", updates=["worse", "same"]
    )
    script = ScriptedJudge(rubric=_judge_rubric)
    async with FakeLLMServer(script.fake_llm()) as judge_server:
        judge = LLMJudge(judge_server.base_url, "judge", max_retries=1, backoff_s=0.001, cache=False)
        server = OnlineServer(
            url,
            policy,
            state_dir=root / "state",
            token=TOKEN,
            run_name="capitals assistant",
            sessions=SessionOptions(idle_s=600),
            updates=UpdateOptions(min_sessions=3, grouping="batch", check_every_s=3600, drain_timeout_s=5),
            gate=GateOptions(agent=held_out_agent, tasks=HELD_OUT, samples=1),
            judge=JudgeOptions(judge=judge, after_s=0, every_s=0.05, max_tries=1),
            metrics_every_s=3600,
        )
        async with server:
            assert server.trainer is not None and server.judge is not None
            for update in range(2):
                for i in range(3 * update, 3 * update + 3):
                    await _ask(server, f"user-{i}", f"Capital of Peru? #{i}")
                    await _rate(server, f"user-{i}", float(i % 2), comment="thanks" if i == 1 else None)
                    await server.sessions.close(f"user-{i}")
                decision = await server.trainer.step()
                assert decision is not None and decision.passed is (update == 1), decision
            await _ask(server, "judged", "Capital of Spain?")
            await server.sessions.close("judged")
            await _ask(server, "odd", "Tell me a joke.")
            await server.sessions.close("odd")
            odd = server.sessions.current["odd"].rollout_id
            await _until(lambda: server.sessions.current["judged"].judged, "the judge scored 'judged'")
            await _until(
                lambda: server.judge is not None and server.judge.tries.get(odd, 0) >= 1, "the judge tried 'odd'"
            )
            await _ask(server, "open", "Capital of Japan?")
        facts = ServeFacts(
            url=url,
            run_id=server.run_id,
            live_version=server.live_version,
            decisions=list(server.decisions),
            judge_malformed=judge.usage.malformed,
            judge_calls=judge.usage.calls,
        )
    assert facts.live_version == 3 and [d["version"] for d in facts.decisions] == [2, 3]
    return facts
