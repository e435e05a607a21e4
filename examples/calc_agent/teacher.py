"""Demonstrations for the SFT warm start: worked Calc-X chains, or a stronger model, played through the agent.

The agent itself produces the demonstrations: :func:`collect` runs ``calc_agent`` on training
problems against a *teacher* endpoint (``Trainer.dev``: the gateway records every call's request
-- messages, tools, ``tool_choice`` -- and reply), keeps the rollouts that earned the full reward,
and returns their calls as :class:`~agentbolt_torch.training.demonstrations.Demonstration` s. SFT renders
them with the policy's own tokenizer through the policy server's chat rendering, so the policy
learns exactly the requests the agent will send and the replies the server will parse.

The teacher is either

- :class:`ChainTeacher` (the default): a small OpenAI-compatible endpoint that answers from the
  problem's Calc-X ``chain`` -- one ``calculator`` tool call per ``<gadget>`` step, then
  ``"EXPR = VALUE. ... <answer>RESULT</answer>"`` -- checking each result the real calculator
  returned against the chain's ``<output>`` (a mismatch ends the episode without an answer, so it
  is not kept); or
- any OpenAI-compatible endpoint (``--teacher URL``): a stronger model's successful rollouts, for
  data without chains.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from calculator import format_number
from chains import chain_steps
from data import parse_number
from fastapi import FastAPI, Request

from agentbolt import types as t
from agentbolt.options import RunnerOptions
from agentbolt.store import open_store
from agentbolt.store.server.uvicorn_thread import UvicornThread
from agentbolt.trainer import Trainer
from agentbolt_torch.training.demonstrations import Demonstration, demonstrations_from_spans

__all__ = ["ChainTeacher", "Collected", "collect"]

log = logging.getLogger(__name__)

CHAIN_TEACHER_MODEL = "calc-x-chains"


def _close(a: str, b: str) -> bool:
    """Whether the calculator's result ``a`` is the chain's output ``b`` (``"3/8 = around 0.375"`` reads as 3/8)."""
    x, y = parse_number(a), parse_number(b.split("=")[0])
    return x is not None and y is not None and abs(x - y) <= 1e-6 + 1e-4 * abs(y)


class ChainTeacher:
    """An OpenAI-compatible endpoint that solves known problems the way their Calc-X chains do.

    ``tasks`` are the loader's tasks (``question``, ``answer``, ``chain``). A request is matched to
    its problem by its last user message; the tool results after it say how far the chain has got.
    """

    def __init__(self, tasks: Sequence[Mapping[str, Any]]) -> None:
        self.problems: dict[str, tuple[list[Any], float]] = {}
        for task in tasks:
            self.problems.setdefault(task["question"], (chain_steps(task.get("chain", "")), float(task["answer"])))
        self.app = FastAPI(title="Calc-X chain teacher")
        self.app.add_api_route("/v1/chat/completions", self.chat, methods=["POST"])
        self.app.add_api_route("/v1/models", self.models, methods=["GET"])
        self._thread: UvicornThread | None = None
        self.base_url = ""

    def reply(self, messages: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """The assistant message for a conversation: the chain's next tool call, or the answer."""
        last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
        question = str(messages[last_user].get("content") or "") if last_user >= 0 else ""
        if question not in self.problems:
            return {"role": "assistant", "content": "I do not know this problem."}
        steps, answer = self.problems[question]
        results = [str(m.get("content") or "") for m in messages[last_user + 1 :] if m.get("role") == "tool"]
        for step, result in zip(steps, results, strict=False):
            if not _close(result, step.output):
                return {"role": "assistant", "content": f"The calculator gave {result}, not {step.output}."}
        if len(results) < len(steps):
            expression = steps[len(results)].expression
            call = {"name": "calculator", "arguments": json.dumps({"expression": expression})}
            return {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": f"call_{len(results)}", "type": "function", "function": call}],
            }
        worked = " ".join(f"{step.expression} = {result}." for step, result in zip(steps, results, strict=False))
        return {"role": "assistant", "content": f"{worked} <answer>{format_number(answer)}</answer>".strip()}

    async def chat(self, request: Request) -> dict[str, Any]:
        body = await request.json()
        message = self.reply(body.get("messages") or [])
        return {
            "id": f"chatcmpl-chain-{time.monotonic_ns():x}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": CHAIN_TEACHER_MODEL,
            "choices": [
                {"index": 0, "message": message, "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}
            ],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        }

    async def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": CHAIN_TEACHER_MODEL, "object": "model", "owned_by": "agentbolt"}]}

    def __enter__(self) -> ChainTeacher:
        import uvicorn

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="off")
        self._thread = UvicornThread(uvicorn.Server(config), sock, name="calc-x-chain-teacher")
        self._thread.start()
        self.base_url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None:
            self._thread.stop(10)
            self._thread = None


@dataclass
class Collected:
    """What :func:`collect` got from the teacher."""

    demonstrations: list[Demonstration]
    problems: int
    """Training problems the teacher was asked."""
    solved: int
    """Problems with a fully rewarded rollout (their calls are the demonstrations)."""
    tool_calls: int
    """Demonstrated calls that call the calculator."""
    seconds: float


async def _read(store: Any, threshold: float) -> tuple[list[t.Rollout], list[Demonstration]]:
    rollouts: list[t.Rollout] = []
    cursor = None
    while True:
        page = await store.query_rollouts(limit=500, cursor=cursor)
        rollouts += page.items
        if not (cursor := page.next_cursor):
            break
    spans: dict[str, list[t.Span]] = {}
    for i in range(0, len(rollouts), 200):
        spans.update(await store.query_spans([r.rollout_id for r in rollouts[i : i + 200]], latest_attempt_only=True))
    return rollouts, demonstrations_from_spans(rollouts, spans, threshold=threshold)


def collect(
    agent: Any,
    tasks: Sequence[Mapping[str, Any]],
    *,
    teacher_url: str | None = None,
    teacher_model: str | None = None,
    api_key: str | None = None,
    threshold: float = 1.0,
    concurrency: int = 16,
) -> Collected:
    """Run ``agent`` on ``tasks`` against the teacher (``teacher_url``, else a :class:`ChainTeacher`
    of the tasks' chains) and return the calls of the rollouts rewarded at least ``threshold``
    (one rollout per task)."""
    started = time.monotonic()
    store = open_store("memory://")
    trainer = Trainer(
        agent, store=store, runners=RunnerOptions(n=0, concurrency=concurrency, max_attempts=1), progress=False
    )
    try:
        if teacher_url is None:
            with ChainTeacher(tasks) as teacher:
                trainer.dev(list(tasks), llm=teacher.base_url, model=CHAIN_TEACHER_MODEL)
        else:
            trainer.dev(list(tasks), llm=teacher_url, model=teacher_model, api_key=api_key)
        rollouts, demos = asyncio.run(_read(store, threshold))
    finally:
        asyncio.run(store.close())
    solved = sum(r.final_reward is not None and r.final_reward >= threshold for r in rollouts)
    tool_calls = sum(bool(d.reply.get("tool_calls")) for d in demos)
    return Collected(demos, len(tasks), solved, tool_calls, time.monotonic() - started)
