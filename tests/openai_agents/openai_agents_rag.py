"""A RAG-style OpenAI Agents SDK agent (the paper's shape) and the fake backend scripting it.

``retriever`` calls ``search_corpus`` (a tiny in-memory corpus), then hands off to ``answerer``,
which answers from the passage: three LLM calls per rollout. A question about a population
makes the retriever call ``lookup_population`` first, a tool that always fails; the run goes on.
"""

from __future__ import annotations

import json
import re
from typing import Any

from agents import Agent, OpenAIChatCompletionsModel, RunConfig, Runner, function_tool
from openai import AsyncOpenAI

from agentbolt.testing.fake_llm import FakeLLM, FakeRequest, Rule, ToolCall, ToolCalls

RETRIEVER = "You are the retriever. Search the corpus for the question, then hand off to the answerer."
ANSWERER = "You are the answerer. Answer the question from the passages found."

CORPUS = {
    "France": "Paris is the capital of France.",
    "Japan": "Tokyo is the capital of Japan.",
    "Italy": "Rome is the capital of Italy.",
    "Kenya": "Nairobi is the capital of Kenya.",
    "Peru": "Lima is the capital of Peru.",
    "Canada": "Ottawa is the capital of Canada.",
}
TASKS = [
    {"question": f"What is the capital of {country}?", "answer": text.split()[0]} for country, text in CORPUS.items()
]
POPULATION_TASK = {"question": "What is the population and the capital of Peru?", "answer": "Lima"}
NO_POPULATION = "no population data for"


@function_tool
def search_corpus(query: str) -> str:
    """Return the passages of the corpus about the query."""
    hits = [text for country, text in CORPUS.items() if country.lower() in query.lower()]
    return "\n".join(hits) or "No passage found."


@function_tool
def lookup_population(country: str) -> str:
    """Return the population of a country."""
    raise LookupError(f"{NO_POPULATION} {country}")


def build_agents(model: OpenAIChatCompletionsModel) -> Agent[Any]:
    answerer = Agent(name="answerer", instructions=ANSWERER, model=model)
    return Agent(
        name="retriever",
        instructions=RETRIEVER,
        model=model,
        tools=[search_corpus, lookup_population],
        handoffs=[answerer],
    )


async def run_rag(base_url: str, model: str, question: str, run_config: RunConfig | None = None) -> Any:
    """One ``Runner.run`` of the agent against an OpenAI-compatible endpoint (the run result)."""
    async with AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0) as client:
        retriever = build_agents(OpenAIChatCompletionsModel(model=model, openai_client=client))
        return await Runner.run(retriever, question, run_config=run_config)


async def rag_agent(task: dict[str, str], resources: Any) -> float:
    """The agent agentbolt trains: reward 1 when the final answer names the right city."""
    result = await run_rag(resources.llm.base_url, resources.llm.model, task["question"])
    return 1.0 if task["answer"] in str(result.final_output) else 0.0


# -- the fake model's script --------------------------------------------------------------------


def _system(req: FakeRequest) -> str:
    messages = req.messages or []
    return str(messages[0].get("content")) if messages and messages[0].get("role") == "system" else ""


def _last_role(req: FakeRequest) -> str:
    messages = req.messages or []
    return str(messages[-1].get("role")) if messages else ""


def _question(req: FakeRequest) -> str:
    return next(str(m.get("content")) for m in req.messages or [] if m.get("role") == "user")


def _tool_names_called(req: FakeRequest) -> list[str]:
    return [
        c["function"]["name"]
        for m in req.messages or []
        if m.get("role") == "assistant"
        for c in m.get("tool_calls") or []
    ]


def _retrieve(req: FakeRequest) -> ToolCalls:
    question = _question(req)
    country = next((c for c in CORPUS if c in question), "nowhere")
    if "population" in question and "lookup_population" not in _tool_names_called(req):
        return ToolCalls([ToolCall("lookup_population", {"country": country})])
    if "search_corpus" not in _tool_names_called(req):
        return ToolCalls([ToolCall("search_corpus", {"query": question})])
    return ToolCalls([ToolCall("transfer_to_answerer", {})])


def answer_text(passage: str) -> str:
    city = passage.split()[0] if passage and passage != "No passage found." else "unknown"
    return f"The answer is {city}."


def _answer(req: FakeRequest) -> str:
    passages = [
        str(m.get("content"))
        for m in req.messages or []
        if m.get("role") == "tool" and re.search(r"capital of", str(m.get("content")))
    ]
    return answer_text(passages[-1] if passages else "")


def make_backend() -> FakeLLM:
    return FakeLLM(
        rules=[
            Rule(match=lambda r: _system(r) == RETRIEVER and _last_role(r) in ("user", "tool"), reply=_retrieve),
            Rule(match=lambda r: _system(r) == ANSWERER, reply=_answer),
        ],
        default_reply="I cannot help with that.",
    )


def tool_calls_of(response_body: str | None) -> list[dict[str, Any]]:
    """The tool calls of a gateway span's ``agentbolt.llm.response`` JSON."""
    body = json.loads(response_body or "{}")
    return body["choices"][0]["message"].get("tool_calls") or []
