"""Per-step overhead of each framework adapter (adapter on vs off).

Run:  uv run python benchmarks/adapters.py [--runs 100] [--rounds 4] [--only langchain autogen openai-agents]

For each adapter, a typical agent of its framework runs ``--runs`` times inside a rollout
context (spans go to a sink that discards them), against the fake OpenAI backend in its own
process (no gateway: this isolates the adapter's cost). Blocks with the adapter uninstrumented
and instrumented alternate ``--rounds`` times (order flipped each round); the figures are
medians. "Per LLM step" divides the added time by the agent's LLM calls per run.

- langchain: a LangGraph write -> check graph (ChatOpenAI), 2 LLM calls per run;
- autogen: an AssistantAgent with a calculator tool (reflect on tool use), 2 LLM calls;
- openai-agents: a retriever agent with a function tool that hands off to an answerer, 3 calls.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from agentbolt.capture.tracing import RolloutContext, install_otel, rollout_context
from agentbolt.testing.fake_llm import FakeLLM, FakeLLMProcess, Rule, ToolCall, ToolCalls


class NullSink:
    def put(self, span: Any) -> None:
        pass


Runner = Callable[[int], Awaitable[None]]
Closer = Callable[[], Awaitable[None]]


async def time_block(run: Runner, n: int) -> float:
    times = []
    for i in range(n):
        with rollout_context(RolloutContext(f"bench-{i}", "attempt", NullSink())):  # type: ignore[arg-type]
            start = time.perf_counter()
            await run(i)
            times.append(time.perf_counter() - start)
    return statistics.median(times)


# -- agents --------------------------------------------------------------------------------------


def langchain_setup(base_url: str) -> tuple[Any, Runner, Closer]:
    from langchain_openai import ChatOpenAI
    from langgraph.graph import END, START, StateGraph
    from typing_extensions import TypedDict

    from agentbolt_langchain import LangChainAdapter

    class State(TypedDict, total=False):
        question: str
        query: str
        verdict: str

    llm = ChatOpenAI(base_url=base_url, api_key="x", model="fake-model", max_retries=0)

    async def write(state: State) -> State:
        return {"query": (await llm.ainvoke(f"Write a SQL query for: {state['question']}")).content}  # type: ignore[typeddict-item]

    async def check(state: State) -> State:
        return {"verdict": (await llm.ainvoke(f"Check this SQL query: {state['query']}")).content}  # type: ignore[typeddict-item]

    graph = StateGraph(State)
    graph.add_node("write", write)
    graph.add_node("check", check)
    graph.add_edge(START, "write")
    graph.add_edge("write", "check")
    graph.add_edge("check", END)
    app = graph.compile(name="sql_agent")

    async def run(i: int) -> None:
        await app.ainvoke({"question": f"users older than {i}"})

    async def close() -> None:
        await llm.async_client._client.close()  # type: ignore[union-attr]

    return LangChainAdapter(), run, close


def autogen_setup(base_url: str) -> tuple[Any, Runner, Closer]:
    from autogen_agentchat.agents import AssistantAgent
    from autogen_ext.models.openai import OpenAIChatCompletionClient

    from agentbolt_autogen import AutogenAdapter

    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression such as 12 * 7."""
        if not re.fullmatch(r"[0-9+\-*/(). ]+", expression):
            raise ValueError(f"not arithmetic: {expression!r}")
        return str(eval(expression, {"__builtins__": {}}))  # digits and operators only

    info: Any = {
        "vision": False,
        "function_calling": True,
        "json_output": False,
        "family": "unknown",
        "structured_output": False,
    }
    client = OpenAIChatCompletionClient(
        model="fake-model", base_url=base_url, api_key="x", model_info=info, max_retries=0
    )

    async def run(i: int) -> None:
        agent = AssistantAgent("solver", model_client=client, tools=[calculator], reflect_on_tool_use=True)
        await agent.run(task=f"What is {i} * 7?")

    return AutogenAdapter(), run, client.close


def openai_agents_setup(base_url: str) -> tuple[Any, Runner, Closer]:
    from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_trace_processors
    from openai import AsyncOpenAI

    from agentbolt_openai_agents import OpenAIAgentsAdapter

    set_trace_processors([])  # measure our processor only; never export to OpenAI from a benchmark

    @function_tool
    def search(query: str) -> str:
        """Search the corpus."""
        return "Paris is the capital of France."

    client = AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0)
    model = OpenAIChatCompletionsModel(model="fake-model", openai_client=client)
    answerer = Agent(name="answerer", instructions="Answer from the notes.", model=model)
    retriever = Agent(
        name="retriever", instructions="Search, then hand off.", model=model, tools=[search], handoffs=[answerer]
    )

    async def run(i: int) -> None:
        await Runner.run(retriever, f"question {i}: capital of France?")

    return OpenAIAgentsAdapter(), run, client.close


def backend_for(name: str) -> FakeLLM:
    if name == "langchain":
        return FakeLLM(
            rules=[Rule(match=r"^Write ", reply="SELECT name FROM users"), Rule(match=r"^Check ", reply="OK")],
            record=False,
        )
    if name == "autogen":
        return FakeLLM(
            rules=[Rule(match=r"^What is", reply=ToolCalls([ToolCall("calculator", {"expression": "6 * 7"})]))],
            default_reply="The answer is 42.",
            record=False,
        )
    # The last message decides: the question -> search; the search result -> hand off; else answer.
    return FakeLLM(
        rules=[
            Rule(match=r"^question", reply=ToolCalls([ToolCall("search", {"query": "France"})])),
            Rule(match=r"^Paris is the capital", reply=ToolCalls([ToolCall("transfer_to_answerer", {})])),
        ],
        default_reply="Paris.",
        record=False,
    )


SETUPS = {"langchain": (langchain_setup, 2), "autogen": (autogen_setup, 2), "openai-agents": (openai_agents_setup, 3)}


async def measure(name: str, runs: int, rounds: int) -> tuple[float, float]:
    setup, _ = SETUPS[name]
    with FakeLLMProcess(backend_for(name)) as server:
        adapter, run, close = setup(server.base_url)
        try:
            await time_block(run, 10)  # warm up connections and caches
            off, on = [], []
            for r in range(rounds):
                for instrumented in (True, False) if r % 2 else (False, True):
                    if instrumented:
                        adapter.instrument()
                        on.append(await time_block(run, runs))
                        adapter.uninstrument()
                    else:
                        off.append(await time_block(run, runs))
        finally:
            await close()
    return statistics.median(off), statistics.median(on)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--only", nargs="+", choices=sorted(SETUPS), default=sorted(SETUPS))
    args = ap.parse_args()
    install_otel()  # as in a runner: OpenTelemetry capture is on in both modes
    print(
        f"adapter overhead: median of {args.rounds} alternating blocks of {args.runs} runs; fake backend in its own process"
    )
    print(f"{'adapter':<15}{'off ms/run':>12}{'on ms/run':>12}{'added ms':>10}{'added %':>9}{'per LLM step':>14}")
    for name in args.only:
        off, on = asyncio.run(measure(name, args.runs, args.rounds))
        calls = SETUPS[name][1]
        added = (on - off) * 1e3
        print(
            f"{name:<15}{off * 1e3:>12.2f}{on * 1e3:>12.2f}{added:>10.2f}{100 * (on - off) / off:>8.1f}%{added / calls:>11.2f} ms"
        )


if __name__ == "__main__":
    main()
