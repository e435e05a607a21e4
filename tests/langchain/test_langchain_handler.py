"""The handler in-process (no gateway): when it records, how runs map to spans, how it fails."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.metadata
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any, TypedDict

import httpx
import pytest

pytest.importorskip("langgraph")

from langchain_core.prompts import ChatPromptTemplate
from langchain_core.tracers import context as lc_context
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph
from langgraph.types import interrupt
from lc_agents import build_sql_graph, build_tool_graph, make_llm, sql_backend

from agentbolt import semconv
from agentbolt.capture.emit import NoRolloutWarning
from agentbolt.capture.tracing import RolloutContext, rollout_context
from agentbolt.errors import UserError
from agentbolt.testing.fake_llm import Failure, FakeLLM, FakeLLMServer, Rule, ToolCall, ToolCalls
from agentbolt.types import Span, StatusCode
from agentbolt_langchain import LangChainAdapter
from agentbolt_langchain import _handler as handler_module


class ListSink:
    """A rollout's span sink that keeps the adapter's spans (not the agent's emitted rewards)."""

    def __init__(self) -> None:
        self.spans: list[Span] = []

    def put(self, span: Span) -> None:
        if span.attributes.get("agentbolt.adapter") == "langchain":
            self.spans.append(span)

    def kinds(self, kind: str) -> list[Span]:
        return [s for s in self.spans if s.attributes.get(semconv.SPAN_KIND_ATTR) == kind]

    def agent_names(self) -> list[str]:
        return [s.attributes[semconv.GEN_AI_AGENT_NAME] for s in self.kinds("agent")]


def backend() -> FakeLLM:
    rules = list(sql_backend().config.rules)
    rules.append(Rule(match=r"^Describe", reply=ToolCalls([ToolCall("lookup", {"table": "users"}, id="call_1")])))
    rules.append(Rule(match=r"^Fail", reply="unused"))
    return FakeLLM(rules=rules, default_reply="Done.", failures=[Failure(status=500, match=r"^Fail")])


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    with FakeLLMServer(backend()) as server:
        yield server.base_url


@pytest.fixture
def adapter() -> Iterator[LangChainAdapter]:
    adapter = LangChainAdapter()
    adapter.instrument()
    yield adapter
    adapter.uninstrument()


def in_rollout(fn: Any, sink: ListSink, rollout_id: str = "r1") -> Any:
    with rollout_context(RolloutContext(rollout_id, f"{rollout_id}-a", sink)):
        return fn()


def sql_graph(base_url: str, **kwargs: Any) -> Any:
    return build_sql_graph(make_llm(base_url), **kwargs)


@contextlib.asynccontextmanager
async def async_llm(base_url: str) -> AsyncIterator[ChatOpenAI]:
    """A ChatOpenAI with its own async HTTP client (langchain-openai caches one per base URL,
    bound to the first event loop that used it; each test has its own loop)."""
    async with httpx.AsyncClient() as client:
        yield ChatOpenAI(base_url=base_url, api_key="x", model="fake-model", max_retries=0, http_async_client=client)


# -- loading and installation -------------------------------------------------------------------------


def test_plugin_module_imports_no_langchain() -> None:
    code = "import sys, agentbolt_langchain.plugin; print(sorted(m for m in sys.modules if m.startswith('lang')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_hook_is_registered_once_even_by_a_second_copy_of_the_module(adapter: LangChainAdapter) -> None:
    def ours() -> list[Any]:
        return [h for h in lc_context._configure_hooks if getattr(h[0], "name", None) == handler_module.HOOK_VAR_NAME]

    handler = handler_module.installed_handler()
    other = LangChainAdapter()
    other.instrument()
    other.uninstrument()
    assert len(ours()) == 1
    fresh = importlib.reload(handler_module)  # as if a second copy were imported
    try:
        assert fresh.installed_handler() is handler
        assert len(ours()) == 1
    finally:
        fresh._HANDLER = handler


def test_unsupported_langgraph_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.6.0" if name == "langgraph" else real(name))
    adapter = LangChainAdapter()
    with pytest.raises(UserError, match=r"langgraph>=1\.0,<2"):
        adapter.instrument()
    assert not adapter.instrumented


def test_bad_option_is_refused() -> None:
    with pytest.raises(UserError, match="agent_names"):
        LangChainAdapter(agent_names="tree")  # type: ignore[arg-type]


# -- when it records ----------------------------------------------------------------------------------


def test_nothing_is_recorded_outside_a_rollout(adapter: LangChainAdapter, base_url: str) -> None:
    handler = handler_module.installed_handler()
    assert handler.ignore_chain and handler.ignore_llm and handler.ignore_agent
    errors = handler.errors  # counted for the process
    with pytest.warns(NoRolloutWarning):  # the agent's own emit_reward says so too
        assert sql_graph(base_url).invoke({"question": "q"})["query"]
    assert handler.recorder.idle() and handler.errors == errors
    sink = ListSink()
    in_rollout(lambda: sql_graph(base_url).invoke({"question": "q"}), sink)
    assert sink.agent_names() == ["write", "check", "sql_agent"]  # ends in order: nodes, then the graph


def test_second_instance_stands_by_and_takes_over(base_url: str) -> None:
    first, second = LangChainAdapter(), LangChainAdapter()
    first.instrument()
    second.instrument()
    try:
        assert first.recording and not second.recording
        first.uninstrument()
        assert second.recording
        sink = ListSink()
        in_rollout(lambda: sql_graph(base_url).invoke({"question": "q"}), sink)
        assert len(sink.kinds("llm")) == 2 and len(sink.kinds("agent")) == 3
    finally:
        second.uninstrument()
        first.uninstrument()
    sink = ListSink()
    in_rollout(lambda: sql_graph(base_url).invoke({"question": "q"}), sink)
    assert sink.spans == []
    assert handler_module.installed_handler().ignore_chain


async def test_concurrent_rollouts_keep_their_own_spans(adapter: LangChainAdapter, base_url: str) -> None:
    sinks = {rid: ListSink() for rid in ("r1", "r2", "r3")}

    async def one(rid: str) -> Any:
        async with async_llm(base_url) as llm:
            with rollout_context(RolloutContext(rid, f"{rid}-a", sinks[rid])):
                question = "q (hard)" if rid == "r2" else "q"
                return await build_sql_graph(llm, use_async=True).ainvoke({"question": question})

    await asyncio.gather(*(one(rid) for rid in sinks))
    assert sinks["r2"].agent_names() == ["write", "check", "rewrite", "check", "sql_agent"]
    assert sinks["r1"].agent_names() == sinks["r3"].agent_names() == ["write", "check", "sql_agent"]
    traces = [{s.trace_id for s in sink.spans} for sink in sinks.values()]
    assert all(len(t) == 1 for t in traces) and len(set.union(*traces)) == 3
    for rid, sink in sinks.items():
        assert {s.rollout_id for s in sink.spans} == {rid}
        ids = {s.span_id for s in sink.spans}
        assert [s.name for s in sink.spans if s.parent_span_id not in ids] == ["invoke_agent sql_agent"]


# -- how runs map to spans ----------------------------------------------------------------------------


def test_a_plain_chain_is_an_agent_named_after_its_run(adapter: LangChainAdapter, base_url: str) -> None:
    chain = (ChatPromptTemplate.from_messages([("user", "Summarize {text}")]) | make_llm(base_url)).with_config(
        run_name="summarizer"
    )
    sink = ListSink()
    message = in_rollout(lambda: chain.invoke({"text": "this"}), sink)
    (agent,) = sink.kinds("agent")
    (llm,) = sink.kinds("llm")
    assert agent.name == "invoke_agent summarizer" and agent.parent_span_id is None
    assert agent.attributes[semconv.GEN_AI_OPERATION_NAME] == semconv.OP_INVOKE_AGENT
    assert llm.parent_span_id == agent.span_id  # the prompt template run is skipped, its sibling attaches
    assert llm.name == "chat fake-model" and llm.kind.value == "CLIENT"
    assert llm.attributes[semconv.GEN_AI_OPERATION_NAME] == semconv.OP_CHAT
    assert llm.attributes[semconv.GEN_AI_REQUEST_MODEL] == "fake-model"
    assert llm.attributes[semconv.GEN_AI_SYSTEM] == "openai"
    assert llm.attributes[semconv.GEN_AI_RESPONSE_ID] == message.response_metadata["id"]
    assert llm.attributes[semconv.GEN_AI_RESPONSE_FINISH_REASONS] == ["stop"]
    assert llm.attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == message.usage_metadata["output_tokens"]
    assert semconv.TOKEN_SOURCE not in llm.attributes
    assert semconv.GEN_AI_INPUT_MESSAGES not in llm.attributes  # content is off by default
    assert agent.start_time_ns <= llm.start_time_ns <= llm.end_time_ns <= agent.end_time_ns


def test_subgraph_agents_are_named_by_node_or_by_path(base_url: str) -> None:
    class S(TypedDict):
        question: str
        query: str

    llm = make_llm(base_url)
    inner = StateGraph(S)
    inner.add_node("model", lambda s: {"query": llm.invoke(f"Write a SQL query for: {s['question']}").content})
    inner.add_edge(START, "model")
    outer = StateGraph(S)
    outer.add_node("writer", inner.compile(name="writer_agent"))
    outer.add_edge(START, "writer")
    graph = outer.compile()
    for mode, expected in (("node", "model"), ("path", "writer/model")):
        adapter = LangChainAdapter(agent_names=mode)
        adapter.instrument()
        try:
            sink = ListSink()
            in_rollout(lambda: graph.invoke({"question": "q"}), sink)
        finally:
            adapter.uninstrument()
        by_id = {s.span_id: s for s in sink.spans}
        (call,) = sink.kinds("llm")
        assert by_id[call.parent_span_id].attributes[semconv.GEN_AI_AGENT_NAME] == expected  # type: ignore[index]
        assert sink.agent_names() == [expected, "writer", "LangGraph"]  # the subgraph's own run is skipped


async def test_capture_content_records_messages_and_tool_io(base_url: str) -> None:
    adapter = LangChainAdapter(capture_content=True)
    adapter.instrument()
    sink = ListSink()
    try:
        async with async_llm(base_url) as llm:
            with rollout_context(RolloutContext("r1", "a1", sink)):
                await build_tool_graph(llm).ainvoke({"messages": [("user", "Describe users")]})
    finally:
        adapter.uninstrument()
    first = sink.kinds("llm")[0]
    assert '"role": "user", "content": "Describe users"' in first.attributes[semconv.GEN_AI_INPUT_MESSAGES]
    assert '"id": "call_1"' in first.attributes[semconv.GEN_AI_OUTPUT_MESSAGES]
    (tool,) = sink.kinds("tool")
    assert tool.attributes["gen_ai.tool.call.arguments"] == '{"table": "users"}'
    assert tool.attributes["gen_ai.tool.call.result"] == "users(name TEXT, age INT)"


def test_llm_errors_mark_the_call_and_its_node(adapter: LangChainAdapter, base_url: str) -> None:
    class S(TypedDict):
        answer: str

    llm = make_llm(base_url)
    graph = StateGraph(S)
    graph.add_node("ask", lambda s: {"answer": llm.invoke("Fail please").content})
    graph.add_edge(START, "ask")
    sink = ListSink()
    with pytest.raises(Exception, match="injected failure"):
        in_rollout(lambda: graph.compile().invoke({"answer": ""}), sink)
    (call,) = sink.kinds("llm")
    assert call.status.code is StatusCode.ERROR and "Error code: 500" in call.status.message
    assert call.events[0].name == "exception"
    assert [s.status.code for s in sink.kinds("agent")] == [StatusCode.ERROR, StatusCode.ERROR]
    assert handler_module.installed_handler().recorder.idle()  # nothing left open


def test_an_interrupt_ends_the_node_without_an_error(adapter: LangChainAdapter) -> None:
    class S(TypedDict):
        answer: str

    graph = StateGraph(S)
    graph.add_node("approve", lambda s: {"answer": interrupt("approve?")})
    graph.add_edge(START, "approve")
    sink = ListSink()
    config = {"configurable": {"thread_id": "t1"}}
    out = in_rollout(lambda: graph.compile(checkpointer=InMemorySaver()).invoke({"answer": ""}, config), sink)
    assert "__interrupt__" in out
    node, root = sink.kinds("agent")
    assert node.status.code is StatusCode.UNSET and node.attributes["langgraph.control_flow"] == "GraphInterrupt"
    assert root.status.code is StatusCode.UNSET


def test_streaming_calls_are_recorded_without_a_response_id(adapter: LangChainAdapter, base_url: str) -> None:
    # langchain-openai does not surface the id of streamed chat completions: never guess one
    llm = make_llm(base_url).model_copy(update={"streaming": True})
    sink = ListSink()
    in_rollout(lambda: llm.invoke("Write a SQL query for: q"), sink)
    (call,) = sink.kinds("llm")
    assert semconv.GEN_AI_RESPONSE_ID not in call.attributes
    assert call.attributes[semconv.GEN_AI_RESPONSE_FINISH_REASONS] == ["stop"]


# -- never raising into LangChain ---------------------------------------------------------------------


def test_translation_errors_never_reach_langchain_nor_lose_the_span(
    adapter: LangChainAdapter, base_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("translation failure injected by the test")

    monkeypatch.setattr(handler_module, "_result_attributes", broken)
    monkeypatch.setattr(handler_module, "_node_path", broken)
    handler = handler_module.installed_handler()
    monkeypatch.setattr(handler, "raise_error", True)  # LangChain would re-raise anything we let out
    errors = handler.errors
    sink = ListSink()
    state = in_rollout(lambda: sql_graph(base_url).invoke({"question": "q"}), sink)
    assert state["query"]
    assert len(sink.kinds("llm")) == 2  # the spans survive, without the unreadable fields
    assert handler.errors == errors + 2
    adapter.agent_names = "path"  # _node_path now fails in on_chain_start: those node spans are lost, not the run
    sink = ListSink()
    assert in_rollout(lambda: sql_graph(base_url).invoke({"question": "q"}), sink)["query"]
    assert sink.agent_names() == ["sql_agent"]
    llm_parents = {s.parent_span_id for s in sink.kinds("llm")}
    assert llm_parents == {sink.kinds("agent")[0].span_id}  # calls attach to the nearest recorded run
