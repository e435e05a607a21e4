"""LangGraph, as its tutorials write a tool-using agent: a ``solver`` node on ChatOpenAI with a
calculator bound, a ``ToolNode``, ``tools_condition`` between them (``streaming=True`` streams
each call). agentbolt-langchain instruments it with no code for agentbolt; each graph node is an
agent (the adapter's rule), so the calls are ``solver``'s."""

from __future__ import annotations

from typing import Annotated, Any, TypedDict

import calc
from langchain_core.messages import AnyMessage, HumanMessage, SystemMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode, tools_condition

from agentbolt import types as t

STREAMING = False


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression such as 12 * 7."""
    return calc.calculator(expression)


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def setup() -> None:
    """Nothing: the adapter hooks LangChain's callbacks itself."""


def agent(task: dict[str, Any], resources: t.Resources) -> float:
    assert resources.llm is not None
    llm = ChatOpenAI(
        base_url=resources.llm.base_url, api_key="x", model=resources.llm.model, streaming=STREAMING, max_retries=0
    ).bind_tools([calculator])

    def solver(state: State) -> dict[str, Any]:
        return {"messages": [llm.invoke([SystemMessage(calc.SYSTEM_PROMPT), *state["messages"]])]}

    graph = StateGraph(State)
    graph.add_node("solver", solver)
    graph.add_node("tools", ToolNode([calculator]))
    graph.add_edge(START, "solver")
    graph.add_conditional_edges("solver", tools_condition)
    graph.add_edge("tools", "solver")
    state = graph.compile().invoke({"messages": [HumanMessage(task["question"])]})
    return calc.score(str(state["messages"][-1].content), task["answer"])
