"""A scripted backend that answers the team as a capable model would (for the example's test and
its screenshot): the manager hands the question to ``solver``, the solver calls the calculator,
then each answers with ``final_answer``. Runs on :class:`agentbolt.testing.fake_llm.FakeLLM`,
which returns exact token ids and logprobs like a vLLM backend.

    uv run python examples/smolagents_agent/scripted.py --store sqlite:///runs/smolagents_scripted.db
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from agentbolt.testing.fake_llm import FakeLLM, FakeLLMServer, FakeRequest, Rule, ToolCall, ToolCalls

HERE = Path(__file__).resolve().parent


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content or "")


def _observation(request: FakeRequest) -> str | None:
    found = re.search(r"Observation:\s*(.+)", _text(request.messages[-1]), re.S)
    return found.group(1) if found else None


def _question(request: FakeRequest) -> str:
    return next(_text(m) for m in request.messages if m["role"] == "user")


def scripted_backend() -> FakeLLM:
    def final(request: FakeRequest) -> ToolCalls:
        return ToolCalls([ToolCall("final_answer", {"answer": re.findall(r"-?\d+", _observation(request) or "0")[-1]})])

    def delegate(request: FakeRequest) -> ToolCalls:
        return ToolCalls([ToolCall("solver", {"task": _question(request)})])

    def calculate(request: FakeRequest) -> ToolCalls:
        found = re.search(r"(\d+ \+ \d+)", _question(request))
        return ToolCalls([ToolCall("calculator", {"expression": found.group(1) if found else "0"})])

    return FakeLLM(
        rules=[
            Rule(match=lambda r: _observation(r) is not None, reply=final),
            Rule(match=lambda r: "solver" in json.dumps(r.body.get("tools", [])), reply=delegate),
            Rule(reply=calculate),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default="sqlite:///runs/smolagents_scripted.db")
    parser.add_argument("--tasks", type=int, default=3)
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    from agent import agent, tasks

    from agentbolt.options import RunnerOptions
    from agentbolt.trainer import Trainer

    if args.store.startswith("sqlite:///"):
        Path(args.store.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    with FakeLLMServer(scripted_backend()) as server:
        result = Trainer(agent, store=args.store, runners=RunnerOptions(n=0), progress=False).dev(
            tasks(args.tasks, held_out=False), llm=server.base_url, model="fake-model"
        )
    print(f"{result.succeeded} rollouts in {args.store}")


if __name__ == "__main__":
    main()
