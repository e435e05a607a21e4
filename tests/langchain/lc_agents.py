"""Real LangGraph agents (ChatOpenAI against the fake backend) for the adapter tests."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AnyMessage, HumanMessage
from langchain_core.tools import ToolException, tool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode, tools_condition

from agentbolt import types as t
from agentbolt.capture.emit import emit_reward
from agentbolt.lightningrl import LightningRL
from agentbolt.options import CaptureOptions, RunnerOptions
from agentbolt.store.memory import MemoryStore
from agentbolt.testing.fake_llm import FakeLLM, FakeLLMServer, Rule, ToolCall, ToolCalls
from agentbolt.trainer import Trainer


def make_llm(base_url: str, model: str = "fake-model") -> ChatOpenAI:
    return ChatOpenAI(base_url=base_url, api_key="x", model=model, max_retries=0)


# -- SQL: write -> check -> (rewrite -> check)* ------------------------------------------------------

GOOD = "SELECT name FROM users WHERE age > 30"
BAD = "SELECT nme FROM usrs"
WRITE_REWARD = {True: 0.1, False: -0.5}
"""Intermediate reward the write node emits for its own call: good query or not."""


def sql_backend() -> FakeLLM:
    """Questions containing ``hard`` get a bad first query, which ``check`` sends to ``rewrite``."""
    return FakeLLM(
        rules=[
            Rule(match=r"^Write .*hard", reply=BAD),
            Rule(match=r"^Write ", reply=GOOD),
            Rule(match=r"^Check .*usrs", reply="WRONG: unknown table usrs"),
            Rule(match=r"^Check ", reply="OK"),
            Rule(match=r"^Rewrite ", reply=GOOD),
        ]
    )


class SqlState(TypedDict, total=False):
    question: str
    query: str
    verdict: str
    rewrites: int


def build_sql_graph(llm: ChatOpenAI, *, use_async: bool = False) -> Any:
    """The write -> check -> rewrite graph; sync nodes, or async ones for ``ainvoke``."""

    def wrote(msg: Any) -> SqlState:
        emit_reward(WRITE_REWARD[msg.content == GOOD], target_response_id=msg.response_metadata["id"])
        return {"query": msg.content, "rewrites": 0}

    def write(state: SqlState) -> SqlState:
        return wrote(llm.invoke(f"Write a SQL query for: {state['question']}"))

    async def awrite(state: SqlState) -> SqlState:
        return wrote(await llm.ainvoke(f"Write a SQL query for: {state['question']}"))

    def check(state: SqlState) -> SqlState:
        return {"verdict": llm.invoke(f"Check this SQL query: {state['query']}").content}

    async def acheck(state: SqlState) -> SqlState:
        return {"verdict": (await llm.ainvoke(f"Check this SQL query: {state['query']}")).content}

    def rewrite(state: SqlState) -> SqlState:
        msg = llm.invoke(f"Rewrite this SQL query: {state['query']} ({state['verdict']})")
        return {"query": msg.content, "rewrites": state["rewrites"] + 1}

    async def arewrite(state: SqlState) -> SqlState:
        msg = await llm.ainvoke(f"Rewrite this SQL query: {state['query']} ({state['verdict']})")
        return {"query": msg.content, "rewrites": state["rewrites"] + 1}

    def route(state: SqlState) -> str:
        return "rewrite" if state["verdict"].startswith("WRONG") and state["rewrites"] < 2 else END

    async def aroute(state: SqlState) -> str:  # no executor hop under ainvoke
        return route(state)

    graph = StateGraph(SqlState)
    graph.add_node("write", awrite if use_async else write)
    graph.add_node("check", acheck if use_async else check)
    graph.add_node("rewrite", arewrite if use_async else rewrite)
    graph.add_edge(START, "write")
    graph.add_edge("write", "check")
    graph.add_conditional_edges("check", aroute if use_async else route, ["rewrite", END])
    graph.add_edge("rewrite", "check")
    return graph.compile(name="sql_agent")


def sql_reward(state: SqlState) -> float:
    """1 for a good final query, less 0.25 per rewrite."""
    return 1.0 - 0.25 * state["rewrites"] if state["query"] == GOOD else 0.0


def sql_agent(task: dict[str, Any], resources: t.Resources) -> float:
    """A sync agent: ``graph.invoke`` (the runner runs it in a thread)."""
    assert resources.llm is not None
    graph = build_sql_graph(make_llm(resources.llm.base_url, resources.llm.model))
    return sql_reward(graph.invoke({"question": task["question"]}))


async def async_sql_agent(task: dict[str, Any], resources: t.Resources) -> float:
    """An async agent: ``await graph.ainvoke`` with async nodes."""
    assert resources.llm is not None
    graph = build_sql_graph(make_llm(resources.llm.base_url, resources.llm.model), use_async=True)
    return sql_reward(await graph.ainvoke({"question": task["question"]}))


# -- tools: a ReAct loop with a ToolNode --------------------------------------------------------------


@tool
def lookup(table: str) -> str:
    """Describe a database table."""
    if table == "usrs":
        raise ValueError(f"no such table: {table}")
    return f"{table}(name TEXT, age INT)"


@tool
def strict_lookup(table: str) -> str:
    """Describe a database table; unknown tables are reported back to the model."""
    raise ToolException(f"unknown table {table}")


strict_lookup.handle_tool_error = True

TOOL_CALLS = [
    ToolCall("lookup", {"table": "users"}, id="call_ok"),
    ToolCall("lookup", {"table": "usrs"}, id="call_raises"),
    ToolCall("strict_lookup", {"table": "usrs"}, id="call_handled"),
]


def tool_backend() -> FakeLLM:
    return FakeLLM(rules=[Rule(match=r"^Describe", reply=ToolCalls(TOOL_CALLS))], default_reply="Done.")


class ChatState(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def build_tool_graph(llm: ChatOpenAI) -> Any:
    model = llm.bind_tools([lookup, strict_lookup])

    async def agent(state: ChatState) -> ChatState:
        return {"messages": [await model.ainvoke(state["messages"])]}

    graph = StateGraph(ChatState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode([lookup, strict_lookup], handle_tool_errors=True))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile()


async def tool_agent(task: dict[str, Any], resources: t.Resources) -> float:
    assert resources.llm is not None
    graph = build_tool_graph(make_llm(resources.llm.base_url, resources.llm.model))
    await graph.ainvoke({"messages": [HumanMessage(f"Describe the tables for: {task['question']}")]})
    return 1.0


# -- running through Trainer.dev -----------------------------------------------------------------------


@dataclass
class DevRun:
    rollouts: list[t.Rollout]
    spans: dict[str, list[t.Span]]
    requests: list[Any]
    """Chat requests the fake backend received (bodies)."""

    def process(self, **options: Any) -> Any:
        return LightningRL(**{"advantage": "grpo", "allow_empty": True, **options}).process(self.rollouts, self.spans)


def run_dev(agent: Callable[..., Any], backend: FakeLLM, tasks: Sequence[Any], *, concurrency: int = 4) -> DevRun:
    """Run ``agent`` on ``tasks`` in ``Trainer.dev`` (in-process runner, memory store, gateway)."""
    store = MemoryStore()
    with FakeLLMServer(backend) as server:
        trainer = Trainer(
            agent,
            store=store,
            runners=RunnerOptions(n=0, concurrency=concurrency),
            capture=CaptureOptions(adapters=[]),
            progress=False,
        )
        result = trainer.dev(list(tasks), llm=server.base_url, model="fake-model")
    assert result.failed == 0, result.failures

    async def collect() -> DevRun:
        rollouts = (await store.query_rollouts(limit=10_000)).items
        spans = await store.query_spans([r.rollout_id for r in rollouts], latest_attempt_only=True)
        return DevRun(rollouts, spans, [r.body for r in backend.requests if r.path.endswith("/chat/completions")])

    return asyncio.run(collect())
